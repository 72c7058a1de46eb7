-- Arguments are checked before anything is written: no key without expiry.
if bad_ms(ARGV[2]) then return redis.error_reply('LOCKRUN invalid expiry ' .. tostring(ARGV[2])) end
local field = 'h:' .. ARGV[1]
local v = redis.pcall('HGET', KEYS[1], field)
if type(v) ~= 'string' then return {0} end
local r = parse(v)
if not r or r.exp <= now_ms() then return {0} end
r.exp = now_ms() + tonumber(ARGV[2])
redis.call('HSET', KEYS[1], field, encode(r))
-- The key lives as long as its longest holder: its expiry is only ever
-- moved later (what PEXPIREAT's GT does, spelled out so Redis 5 and 6 run
-- it too). A key without expiry (one an older lockrun left, say) gets its
-- longest holder's.
local left = redis.call('PTTL', KEYS[1])
if left == -1 then
  local far = r.exp
  local all = redis.call('HGETALL', KEYS[1])
  for i = 2, #all, 2 do
    local o = parse(all[i])
    if o and o.exp > far then far = o.exp end
  end
  redis.call('PEXPIREAT', KEYS[1], fmt(far))
elseif left >= 0 and now_ms() + left < r.exp then
  redis.call('PEXPIREAT', KEYS[1], fmt(r.exp))
end
-- Asked to stop by a --preempt request: renewed all the same (the job
-- is stopped under it), and the mark lasts as long.
local by = preempted_by(r.token)
if by then
  keep_marks_until(r.exp)
  return {2, by}
end
return {1}
