-- Arguments are checked before anything is written: no key without expiry.
if bad_ms(ARGV[3]) then return redis.error_reply('LOCKRUN invalid expiry ' .. tostring(ARGV[3])) end
if bad_ms(ARGV[8]) then return redis.error_reply('LOCKRUN invalid expiry ' .. tostring(ARGV[8])) end
local ttl, mode, limit = tonumber(ARGV[3]), ARGV[4], tonumber(ARGV[5])
if not string.match(mode, '^[xsn]$') or not limit or limit < 1 or limit > 1000000 then
  return redis.error_reply('LOCKRUN invalid mode')
end
if ARGV[11] ~= '' and (not string.match(ARGV[11], '^%d+$') or #ARGV[11] > 16) then
  return redis.error_reply('LOCKRUN invalid arrival number')
end
-- The concurrency group; absent (an older call's arguments) is none.
local max_waiters = nil
if ARGV[12] ~= nil and ARGV[12] ~= '' then
  max_waiters = tonumber(ARGV[12])
  if not string.match(ARGV[12], '^%d+$') or not max_waiters or max_waiters < 1 or max_waiters > 4294967295 then
    return redis.error_reply('LOCKRUN invalid max-waiters')
  end
end
local supersede, preempt = ARGV[13] == '1', ARGV[14] == '1'
if supersede ~= superseding(ARGV[7]) then
  return redis.error_reply('LOCKRUN invalid waiter id for --supersede')
end
-- Replaced by a newer --supersede request: the word left for us, once.
local by = replaced_by(ARGV[7])
if by then
  redis.call('DEL', KEYS[5] .. ARGV[7])
  return {5, by}
end
local alive = now_ms() + tonumber(ARGV[8])
local placed = tonumber(redis.call('ZSCORE', KEYS[6], ARGV[7]) or '')
local live_place = placed ~= nil and placed > now_ms()
-- A queued waiter that only keeps its place: behind a live head, or at the
-- head while every holder's lease runs on, a few commands however long the
-- queue (the head hears when the soonest lease ends). Not queued, woken,
-- a dead head or a lease that ran out: the full path.
-- A place that lapsed is not kept here: its return is the full path's.
if ARGV[10] == '1' and live_place then
  redis.call('ZADD', KEYS[6], alive, ARGV[7])
  local head = redis.call('ZRANGE', KEYS[3], 0, 0)[1]
  local soon = nil
  if head == ARGV[7] then
    local all = redis.call('HGETALL', KEYS[1])
    for i = 2, #all, 2 do
      local r = parse(all[i])
      local left = r and r.exp - now_ms()
      if not left or left <= 0 then soon = nil break end
      if not soon or left < soon then soon = left end
    end
  elseif head then
    local head_alive = redis.call('ZSCORE', KEYS[6], head)
    if head_alive and tonumber(head_alive) > now_ms() then soon = -1 end
  end
  if soon then
    extend_queue(tonumber(ARGV[8]))
    return {2, '', soon}
  end
end
local hs = holders()
if not hs then return redis.error_reply('LOCKRUN the key exists but is not a lockrun lease') end
-- Queue this request at arrival number `seq` (or keep it there).
local function enqueue(seq)
  redis.call('ZADD', KEYS[3], seq, ARGV[7])
  redis.call('HSET', KEYS[4], ARGV[7], ARGV[3] .. '|' .. mode .. '|' .. ARGV[5] .. '|' ..
    ARGV[1] .. '|' .. ARGV[2])
  keep_place(ARGV[7], tonumber(ARGV[8]))
end
-- What to answer. Serving the queue may grant to a waiter on any path, so
-- every answer is followed by one settle: the key never stays without an
-- expiry, whichever way this call ends.
local function answer()
  local mine = 'h:' .. ARGV[1]
  -- A waiter whose place lapsed while it lived (the server paused past
  -- ttl/3, or the waiter itself) takes it back at its arrival number
  -- before the queue is served: no waiter that came later goes first. A
  -- place still there is kept the same way, so serving does not drop it.
  local back = ARGV[6] == '1' and ARGV[11] ~= ''
  for _, r in ipairs(hs) do
    if r.field == mine then back = false end
  end
  -- When no one else kept a place either, the whole queue lapsed (the
  -- server, or the way to it, stalled): the others come back in no
  -- particular order, so the queue regathers before it is served: for as
  -- long as a waiter may take to come back once the server answers again
  -- (its span, at most the 2 s bound on one request) plus the longest
  -- pause between two tries (1 s). Never longer: a waiter that alone
  -- lapsed (it was paused itself) must not hold a free name for long.
  if back and not live_place and not gathering() and not disagreeing(mode, limit, hs)
      and #redis.call('ZRANGEBYSCORE', KEYS[6], '(' .. fmt(now_ms()), '+inf', 'LIMIT', 0, 1) == 0 then
    redis.call('HSET', KEYS[4], '~gather', fmt(now_ms() + math.min(tonumber(ARGV[8]), 2000) + 1000))
    if redis.call('PTTL', KEYS[4]) < 0 then
      redis.call('PEXPIREAT', KEYS[4], fmt(now_ms() + 2 * tonumber(ARGV[8]) + 1000))
    end
  end
  if back then
    enqueue(ARGV[11])
    -- Back at our arrival number: of the --supersede waiters, only the
    -- newest stays, as if we had never lapsed.
    if supersede then
      local newer = nil
      for _, id in ipairs(redis.call('ZRANGE', KEYS[3], 0, -1)) do
        if id ~= ARGV[7] and superseding(id) then
          if tonumber(redis.call('ZSCORE', KEYS[3], id)) < tonumber(ARGV[11]) then
            replace(id, ARGV[2])
          else
            newer = id
          end
        end
      end
      if newer then
        local w = parse_waiter(redis.call('HGET', KEYS[4], newer))
        dequeue(ARGV[7])
        redis.call('DEL', KEYS[5] .. ARGV[7])
        serve(hs)
        return {5, w and w.label or ''}
      end
    end
  end
  local live = serve(hs)
  for _, r in ipairs(hs) do
    if r.field == mine then
      r.exp = now_ms() + ttl
      redis.call('HSET', KEYS[1], mine, encode(r))
      -- Marked while the grant waited for us: the mark lasts as long.
      if preempted_by(r.token) then keep_marks_until(r.exp) end
      dequeue(ARGV[7])
      redis.call('DEL', KEYS[5] .. ARGV[7])
      return {1, r.token, r.slot}
    end
  end
  -- Run from inside a job holding this name: any wait would be for
  -- ourselves. A place kept by --min-hold runs no job to be inside of.
  if ARGV[9] ~= '' then
    for _, r in ipairs(hs) do
      local label_is_outer = r.label == ARGV[9] or
        string.sub(r.label, 1, #ARGV[9] + 2) == ARGV[9] .. ' ('
      if label_is_outer and kind_code(r.field) ~= 2 then
        dequeue(ARGV[7])
        return {4}
      end
    end
  end
  local other = disagreeing(mode, limit, hs)
  if other then
    dequeue(ARGV[7])
    redis.call('DEL', KEYS[5] .. ARGV[7])
    return {3, other.mode, other.limit}
  end
  local queued = redis.call('ZSCORE', KEYS[3], ARGV[7])
  if queued then
    if not back then keep_place(ARGV[7], tonumber(ARGV[8])) end
    return {2, first_label(hs), soonest_end(hs), tonumber(queued), in_the_way(mode, hs)}
  end
  -- --supersede: the --supersede waiters queued (all before us); they
  -- leave once we join, and do not count for --max-waiters.
  local olds = {}
  if supersede then
    prune_replaced()
    for _, id in ipairs(redis.call('ZRANGE', KEYS[3], 0, -1)) do
      if superseding(id) then olds[#olds + 1] = id end
    end
  end
  -- --max-waiters: live places only. Any left means we must wait (the
  -- queue was served above), so a request that could be granted is
  -- never refused here.
  if max_waiters and ARGV[6] == '1' then
    local n = redis.call('ZCOUNT', KEYS[6], '(' .. fmt(now_ms()), '+inf')
    for _, id in ipairs(olds) do
      local until_ms = tonumber(redis.call('ZSCORE', KEYS[6], id) or '')
      if until_ms and until_ms > now_ms() then n = n - 1 end
    end
    if n >= max_waiters then return {6, n} end
  end
  if #olds > 0 and ARGV[6] == '1' then
    for _, id in ipairs(olds) do replace(id, ARGV[2]) end
    live = serve(hs)
  end
  local ok, slot = can_grant(mode, limit, hs)
  -- --preempt, finding the name held: a --min-hold window, which runs no
  -- job, ends at once; if we must still wait, every holder of the moment
  -- is asked to stop (a revoked one stops already; a waiter served as a
  -- window ended came before us and is not disturbed).
  if preempt and ARGV[6] == '1' and not (live == 0 and ok) then
    local kept, running, ended = {}, {}, false
    for _, r in ipairs(hs) do
      if kind_code(r.field) == 2 then
        redis.call('HDEL', KEYS[1], r.field)
        ended = true
      else
        kept[#kept + 1] = r
        -- A holder asked to stop already stops: its mark stays the first.
        if kind_code(r.field) == 0 and not preempted_by(r.token) then
          running[#running + 1] = r
        end
      end
    end
    if ended then
      for i = #hs, 1, -1 do hs[i] = nil end
      for i, r in ipairs(kept) do hs[i] = r end
      live = serve(hs)
      ok, slot = can_grant(mode, limit, hs)
    end
    if not (live == 0 and ok) and KEYS[7] and #running > 0 then
      local far = 0
      for _, r in ipairs(running) do
        redis.call('HSET', KEYS[7], r.token, ARGV[2])
        if r.exp > far then far = r.exp end
      end
      keep_marks_until(far)
    end
  end
  if live == 0 and ok then
    local r = grant(hs, ARGV[1], ARGV[2], ttl, mode, limit, slot)
    return {1, r.token, r.slot}
  end
  if ARGV[6] ~= '1' then return {0, first_label(hs), in_the_way(mode, hs)} end
  local blocker = in_the_way(mode, hs)
  -- Behind everyone already queued, also within one microsecond.
  local last = redis.call('ZRANGE', KEYS[3], -1, -1, 'WITHSCORES')
  local seq = now_us()
  if last[2] and tonumber(last[2]) >= seq then seq = tonumber(last[2]) + 1 end
  enqueue(fmt(seq))
  return {2, first_label(hs), soonest_end(hs), seq, blocker}
end
local reply = answer()
settle(hs)
return reply
