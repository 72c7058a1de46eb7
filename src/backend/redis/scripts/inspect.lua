local all = redis.call('HGETALL', KEYS[1])
local out = {now_ms(), 0, 0}
for i = 1, #all, 2 do
  local r = parse(all[i + 1])
  local kind = string.sub(all[i], 1, 2)
  if not r or (kind ~= 'h:' and kind ~= 'r:' and kind ~= 'm:') then
    return redis.error_reply('LOCKRUN the key exists but is not a lockrun lease')
  end
  if r.exp > now_ms() then
    for _, v in ipairs({r.label, r.token, r.slot, r.mode, r.limit, r.exp - now_ms(),
        now_ms() - r.granted, kind_code(all[i]), preempted_by(r.token) or ''}) do
      out[#out + 1] = v
    end
  end
end
-- Live places only; of those, the ones that asked for --supersede.
local live = redis.call('ZRANGEBYSCORE', KEYS[6], '(' .. fmt(now_ms()), '+inf')
out[2] = #live
for _, id in ipairs(live) do
  if superseding(id) then out[3] = out[3] + 1 end
end
return out
