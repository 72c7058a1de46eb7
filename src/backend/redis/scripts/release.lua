local hs = holders()
if not hs then return 0 end
local found = 0
local kept = {}
for _, r in ipairs(hs) do
  if r.field == 'h:' .. ARGV[1] then
    redis.call('HDEL', KEYS[1], r.field)
    found = 1
  else
    kept[#kept + 1] = r
  end
end
dequeue(ARGV[2])
redis.call('DEL', KEYS[5] .. ARGV[2])
serve(kept)
settle(kept)
return found
