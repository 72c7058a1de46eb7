-- Arguments are checked before anything is written.
local hold = 0
if ARGV[3] ~= nil and ARGV[3] ~= '' and ARGV[3] ~= '0' then
  if bad_ms(ARGV[3]) then return redis.error_reply('LOCKRUN invalid min-hold ' .. tostring(ARGV[3])) end
  hold = tonumber(ARGV[3])
end
local hs = holders()
if not hs then return 0 end
local found = 0
local kept = {}
local window = false
for _, r in ipairs(hs) do
  if r.field == 'h:' .. ARGV[1] then
    redis.call('HDEL', KEYS[1], r.field)
    found = 1
    -- Asked to stop by a --preempt request: the mark goes with the lease,
    -- and no --min-hold window is kept for the job it stopped.
    local marked = preempted_by(r.token)
    if marked then redis.call('HDEL', KEYS[7], r.token) end
    -- --min-hold: the place stays taken, by no one, until the grant plus
    -- the window on the server's clock (the grant's time is the server's,
    -- in whole ms rounded down: one more ms ends it no sooner than asked).
    -- Without --min-hold nothing is kept, whatever the clock reads now (a
    -- clock behind the grant's would otherwise keep the place).
    if hold > 0 and not marked and r.granted + hold + 1 > now_ms() then
      r.field = 'm:' .. r.token
      r.exp = r.granted + hold + 1
      redis.call('HSET', KEYS[1], r.field, encode(r))
      kept[#kept + 1] = r
      window = true
    end
  else
    kept[#kept + 1] = r
  end
end
dequeue(ARGV[2])
redis.call('HDEL', KEYS[4], '~r:' .. ARGV[2])
redis.call('DEL', KEYS[5] .. ARGV[2])
serve(kept)
-- The head heard when our lease would end; the window may end sooner.
if window then wake_head() end
settle(kept)
return found
