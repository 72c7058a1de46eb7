local NOW_US
local function now_us()
  if not NOW_US then
    local t = redis.call('TIME')
    NOW_US = tonumber(t[1]) * 1000000 + tonumber(t[2])
  end
  return NOW_US
end
local function now_ms() return math.floor(now_us() / 1000) end
local function fmt(n) return string.format('%d', n) end
local function bad_ms(v)
  local n = tonumber(v)
  return not n or n < 1 or n > 604800000 or n % 1 ~= 0
end
local function parse(v)
  local tok, exp, mode, lim, slot, granted, label =
    string.match(v, '^(%d+)|(%d+)|([xsn])|(%d+)|(%-?%d+)|(%d+)|(.*)$')
  if not tok then return nil end
  return {token = tok, exp = tonumber(exp), mode = mode, limit = tonumber(lim),
    slot = tonumber(slot), granted = tonumber(granted), label = label}
end
local function encode(r)
  return r.token .. '|' .. fmt(r.exp) .. '|' .. r.mode .. '|' .. fmt(r.limit) .. '|' ..
    fmt(r.slot) .. '|' .. fmt(r.granted) .. '|' .. r.label
end
-- The holders in force, expired ones purged; nil if the key is not ours.
local function holders()
  local all = redis.call('HGETALL', KEYS[1])
  local out = {}
  for i = 1, #all, 2 do
    local f = all[i]
    local r = parse(all[i + 1])
    local kind = string.sub(f, 1, 2)
    -- h: a holder, r: one revoked by release --force, m: a place kept by
    -- --min-hold after its job ended (no owner: nothing renews or frees it).
    if not r or (kind ~= 'h:' and kind ~= 'r:' and kind ~= 'm:') then return nil end
    if r.exp <= now_ms() then
      redis.call('HDEL', KEYS[1], f)
    else
      r.field = f
      out[#out + 1] = r
    end
  end
  return out
end
-- The key lives as long as its longest holder: nothing stays behind.
local function settle(hs)
  local far = 0
  for _, r in ipairs(hs) do if r.exp > far then far = r.exp end end
  if far == 0 then redis.call('DEL', KEYS[1]) else redis.call('PEXPIREAT', KEYS[1], far) end
end
-- A holder that disagrees with a request of this mode and limit, if any.
local function disagreeing(mode, limit, hs)
  for _, r in ipairs(hs) do
    if (r.mode == 'n') ~= (mode == 'n') or (mode == 'n' and r.limit ~= limit) then
      return r
    end
  end
  return nil
end
local function can_grant(mode, limit, hs)
  if mode == 'x' then return #hs == 0, -1 end
  if mode == 's' then
    for _, r in ipairs(hs) do if r.mode ~= 's' then return false end end
    return true, -1
  end
  if #hs >= limit then return false end
  local used = {}
  for _, r in ipairs(hs) do used[r.slot] = true end
  for s = 0, limit - 1 do if not used[s] then return true, s end end
  return false
end
-- The counter floored by the server clock: tokens keep growing even when a
-- restart or a failover lost the counter.
local function next_token()
  local token = redis.call('INCR', KEYS[2])
  if token < now_us() then
    token = now_us()
    redis.call('SET', KEYS[2], fmt(token))
  end
  return fmt(token)
end
local function grant(hs, owner, label, ttl, mode, limit, slot)
  local r = {token = next_token(), exp = now_ms() + ttl, mode = mode, limit = limit,
    slot = slot, granted = now_ms(), label = label, field = 'h:' .. owner}
  redis.call('HSET', KEYS[1], r.field, encode(r))
  hs[#hs + 1] = r
  return r
end
local function parse_waiter(v)
  if not v then return nil end
  local ttl, mode, lim, owner, label = string.match(v, '^(%d+)|([xsn])|(%d+)|(%x+)|(.*)$')
  if not ttl then return nil end
  return {ttl = tonumber(ttl), mode = mode, limit = tonumber(lim), owner = owner, label = label}
end
local function dequeue(id)
  redis.call('ZREM', KEYS[3], id)
  redis.call('HDEL', KEYS[4], id)
  redis.call('ZREM', KEYS[6], id)
end
local function wake(id, what, ttl)
  redis.call('RPUSH', KEYS[5] .. id, what)
  redis.call('PEXPIRE', KEYS[5] .. id, ttl)
end
-- Until when the queue regathers after every place in it lapsed at once (a
-- server paused or cut off past the places' span): its waiters come back in
-- no particular order, each to its own arrival number, and no grant is
-- made from the queue until the earlier ones have had time to return.
-- Nil when not regathering.
local function gathering()
  local g = tonumber(redis.call('HGET', KEYS[4], '~gather') or '')
  if g and g > now_ms() then return g end
  return nil
end
-- Serve the queue in arrival order: grant to its head while the head fits
-- beside the holders (a later request never overtakes an earlier one), wake
-- each one served. A handed grant lasts a third of the waiter's ttl until the
-- waiter confirms it, so a waiter that died in the queue delays the next by
-- at most that. A head that disagrees with the holders is woken to hear so.
-- Waiters that stopped keeping their place are dropped first. The work does
-- not grow with the queue. Returns 1 if anyone still waits, else 0. (The
-- queue keys live as long as the last place kept; emptied, Redis deletes
-- them.)
local function serve(hs)
  local gather = gathering()
  if not gather then redis.call('HDEL', KEYS[4], '~gather') end
  local dead = redis.call('ZRANGEBYSCORE', KEYS[6], '-inf', now_ms())
  for _, id in ipairs(dead) do dequeue(id) end
  local changed = #dead > 0
  local head, w
  while true do
    head = redis.call('ZRANGE', KEYS[3], 0, 0)[1]
    if not head then break end
    w = parse_waiter(redis.call('HGET', KEYS[4], head))
    if not w then
      dequeue(head)
    elseif disagreeing(w.mode, w.limit, hs) then
      dequeue(head)
      wake(head, 'refused', w.ttl)
    else
      local ok, slot = can_grant(w.mode, w.limit, hs)
      if not ok or gather then break end
      local r = grant(hs, w.owner, w.label, math.max(1, math.floor(w.ttl / 3)), w.mode,
        w.limit, slot)
      dequeue(head)
      wake(head, r.token, w.ttl)
    end
    changed = true
  end
  -- A new head, or holders that changed under it: it must look again (a
  -- waiter only keeping its place does not look at the holders).
  if changed and head then wake(head, 'look', w.ttl) end
  return head and 1 or 0
end
-- The queue keys (always given one expiry) outlive every place kept: when
-- less than a place's span `span` is left, they get two.
local function extend_queue(span)
  if redis.call('PTTL', KEYS[6]) < span then
    local until_ms = now_ms() + 2 * span
    for _, i in ipairs({3, 6}) do redis.call('PEXPIREAT', KEYS[i], fmt(until_ms)) end
    -- The waiters' hash may hold word for a replaced waiter that must
    -- outlast the places: its expiry is only ever moved later.
    local left = redis.call('PTTL', KEYS[4])
    if left < 0 or now_ms() + left < until_ms then
      redis.call('PEXPIREAT', KEYS[4], fmt(until_ms))
    end
  end
end
-- Keep a waiter's place until now + `span`.
local function keep_place(id, span)
  redis.call('ZADD', KEYS[6], now_ms() + span, id)
  extend_queue(span)
end
-- What status and release --force say of a holder's kind: 0 a holder, 1
-- revoked, 2 kept by --min-hold.
local function kind_code(field)
  local kind = string.sub(field, 1, 2)
  if kind == 'r:' then return 1 end
  if kind == 'm:' then return 2 end
  return 0
end
-- The head of the queue must look at the holders again: the soonest end it
-- heard has moved.
local function wake_head()
  local head = redis.call('ZRANGE', KEYS[3], 0, 0)[1]
  if not head then return end
  local w = parse_waiter(redis.call('HGET', KEYS[4], head))
  if w then wake(head, 'look', w.ttl) end
end
local function first_label(hs)
  if not hs[1] then return '' end
  -- Waiting lines name a kept place for what it is: no job runs under it.
  if kind_code(hs[1].field) == 2 then return 'the min-hold window of ' .. hs[1].label end
  return hs[1].label
end
-- Who keeps a request of this mode waiting, as the admission table names
-- it (once the queue was served): the first waiter still queued ahead of it
-- ('w:' .. its id: the line stops there), else the first holder in its way
-- (its field; under --limit the name is full, so the first holder).
local function in_the_way(mode, hs)
  local head = redis.call('ZRANGE', KEYS[3], 0, 0)[1]
  if head and head ~= ARGV[7] then return 'w:' .. head end
  for _, r in ipairs(hs) do
    if mode ~= 's' or r.mode ~= 's' then return r.field end
  end
  return ''
end
-- When the head must look again on its own: the soonest holder's end, or
-- the end of a regathering (-1: neither).
local function soonest_end(hs)
  local soon = -1
  for _, r in ipairs(hs) do
    local left = r.exp - now_ms()
    if soon < 0 or left < soon then soon = left end
  end
  local g = gathering()
  if g and (soon < 0 or g - now_ms() < soon) then soon = g - now_ms() end
  return soon
end
-- --supersede: a waiter that asked for it has an id that starts with 's'
-- (an older lockrun's ids are hex: it never supersedes, and is never
-- replaced).
local function superseding(id) return string.sub(id, 1, 1) == 's' end
-- Take waiter `id` out of the queue, replaced by the request shown as
-- `by`: the word waits for it in the waiters' hash, '~r:<id>' = 'until
-- ms|by', for as long as the waiter may take to come back (its ttl, at
-- least 5 s: its next call reads it), and its wake-up list wakes it at once.
local function replace(id, by)
  local w = parse_waiter(redis.call('HGET', KEYS[4], id))
  local ttl = math.max((w and w.ttl) or 0, 5000)
  dequeue(id)
  redis.call('HSET', KEYS[4], '~r:' .. id, fmt(now_ms() + ttl) .. '|' .. by)
  local left = redis.call('PTTL', KEYS[4])
  if left < ttl then redis.call('PEXPIRE', KEYS[4], ttl) end
  wake(id, 'replaced', ttl)
end
-- The word left for waiter `id`, if any (read once: it goes).
local function replaced_by(id)
  local v = redis.call('HGET', KEYS[4], '~r:' .. id)
  if not v then return nil end
  redis.call('HDEL', KEYS[4], '~r:' .. id)
  return string.match(v, '^%d+|(.*)$') or ''
end
-- Words never read (their waiter died) go once their time is up.
local function prune_replaced()
  local all = redis.call('HGETALL', KEYS[4])
  for i = 1, #all, 2 do
    if string.sub(all[i], 1, 3) == '~r:' then
      local t = tonumber(string.match(all[i + 1], '^(%d+)|') or '')
      if not t or t <= now_ms() then redis.call('HDEL', KEYS[4], all[i]) end
    end
  end
end
-- --preempt: the holders asked to stop, a hash of token -> the request
-- shown as `host:pid (label)` (KEYS[7], absent for scripts given six keys).
-- It lives as long as the longest lease it marks: its expiry is only ever
-- moved later.
local function preempted_by(token)
  if not KEYS[7] then return false end
  return redis.call('HGET', KEYS[7], token)
end
local function keep_marks_until(t)
  local left = redis.call('PTTL', KEYS[7])
  if left == -2 then return end
  if left < 0 or now_ms() + left < t then redis.call('PEXPIREAT', KEYS[7], fmt(t)) end
end
