local hs = holders()
if not hs then return redis.error_reply('LOCKRUN the key exists but is not a lockrun lease') end
if #hs == 0 then return {0} end
local out = {1}
local kept, tokens, matched, deleted = {}, {2}, false, false
for _, r in ipairs(hs) do
  tokens[#tokens + 1] = r.token
  local hit = ARGV[1] == '' or r.token == ARGV[1]
  matched = matched or hit
  local kind = kind_code(r.field)
  if hit and (ARGV[2] == '1' or kind ~= 1) then
    for _, v in ipairs({r.label, r.token, r.slot, r.mode, r.limit, r.exp - now_ms(),
        now_ms() - r.granted, kind, preempted_by(r.token) or ''}) do
      out[#out + 1] = v
    end
    redis.call('HDEL', KEYS[1], r.field)
    -- A place kept by --min-hold runs no job: it goes at once, --now or not.
    if ARGV[2] == '1' or kind == 2 then
      deleted = true
      if preempted_by(r.token) then redis.call('HDEL', KEYS[7], r.token) end
    else
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
if deleted then serve(kept) end
settle(kept)
return out
