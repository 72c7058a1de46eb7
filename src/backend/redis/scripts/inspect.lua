local all = redis.call('HGETALL', KEYS[1])
local out = {now_ms(), 0}
for i = 1, #all, 2 do
  local r = parse(all[i + 1])
  local kind = string.sub(all[i], 1, 2)
  if not r or (kind ~= 'h:' and kind ~= 'r:' and kind ~= 'm:') then
    return redis.error_reply('LOCKRUN the key exists but is not a lockrun lease')
  end
  if r.exp > now_ms() then
    for _, v in ipairs({r.label, r.token, r.slot, r.mode, r.limit, r.exp - now_ms(),
        now_ms() - r.granted, kind_code(all[i])}) do
      out[#out + 1] = v
    end
  end
end
out[2] = redis.call('ZCOUNT', KEYS[6], '(' .. fmt(now_ms()), '+inf')
return out
