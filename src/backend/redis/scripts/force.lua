local hs = holders()
if not hs then return redis.error_reply('LOCKRUN the key exists but is not a lockrun lease') end
if #hs == 0 then return {0} end
local out = {1}
local kept, tokens, matched = {}, {2}, false
for _, r in ipairs(hs) do
  tokens[#tokens + 1] = r.token
  local hit = ARGV[1] == '' or r.token == ARGV[1]
  matched = matched or hit
  local revoked = string.sub(r.field, 1, 2) == 'r:'
  if hit and (ARGV[2] == '1' or not revoked) then
    for _, v in ipairs({r.label, r.token, r.slot, r.mode, r.limit, r.exp - now_ms(),
        now_ms() - r.granted, revoked and 1 or 0}) do
      out[#out + 1] = v
    end
    redis.call('HDEL', KEYS[1], r.field)
    if ARGV[2] ~= '1' then
      r.field = 'r:' .. r.token
      redis.call('HSET', KEYS[1], r.field, encode(r))
      kept[#kept + 1] = r
    end
  else
    kept[#kept + 1] = r
  end
end
if not matched then return tokens end
if #out == 1 then return {3} end
if ARGV[2] == '1' then serve(kept) end
settle(kept)
return out
