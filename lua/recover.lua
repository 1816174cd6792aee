#!lua
-- recover: return jobs whose lease expired (their worker died or stalled) to pending.
-- @include now_ms
-- @include queue_keys
-- @include claimable
-- @include signal
-- @include push_signals
-- @include death
-- @include gate
-- @include run
--
-- KEYS[1..15] the queue's keys (includes/queue_keys.lua). Used here: active and leases (the
--             expired leases end), pending and wake (recovered jobs), dead (buried ones),
--             outbox and outbox_wake (a buried child's signal to its parent)
-- KEYS[15+j]  the row of candidate j (ARGV[3+j])
-- then 2 keys per gate named in ARGV[3]: the gate (waiting, cap) of a capped parent's children
--             in this queue (includes/gate.lua)
-- ARGV[1] queue   this queue's name
-- ARGV[2] max_stalls  a job whose lease expired more than this many times is buried
-- ARGV[3] gates   '' (no candidate is gated) or one number per candidate, space-separated: 0
--                 not gated, g its gate's keys are the g-th pair after the rows (the host read
--                 the rows' gate marks)
-- ARGV[4..]       candidate ids (read by the host from active, by deadline)
--
-- Steps: for each candidate still in active with a deadline in the past (re-checked here, so a
-- heartbeat that landed since the host's read wins): drop it from active and leases, count a
-- stall, and put it at the FRONT of pending (it has waited already). A job past max_stalls
-- dies instead; its parent, if any, is settled through this queue's outbox by its policy token
-- (the Pump delivers, same-queue parents included: no parent key is derived here). A buried
-- gated child returns its cap token here (its gate admits the next); a recovered one keeps it.
-- Full server: refused before it runs (no allow-oom): it may grow memory, so it writes all or
--  nothing.
-- Owner of what it writes: pending entries are claimed; dead entries go with the dead retention
-- (expire.lua), a plain job's row with them, a flow child's row with its flow; the stalls/state
-- fields (and the claim's copy of stalls in 'run', includes/run.lua) go with the row; outbox
-- signals are trimmed by the Pump; the wake member is popped by idle workers, the outbox:wake
-- member by an idle Pump.
-- The gate's count and the children it admits: see includes/gate.lua (its keys go with the flow).
-- Returns: {recovered, buried, {id, error, payload, attempts, max_attempts, parent,
-- parent_queue, parent_policy, stalls, timeout, gate} per buried job} - the row's separate
-- fields (maintenance._job reads them), so the host can report each death to its lifecycle hooks.
local q = queue_keys(KEYS)
local queue, max_stalls = ARGV[1], tonumber(ARGV[2])
local now = now_ms()
local back, dead, gone, signals, reports = {}, {}, {}, {}, {}
local n = #ARGV - 3
local refs, freed = {}, {}
for g in string.gmatch(ARGV[3], '%S+') do refs[#refs + 1] = tonumber(g) end
for j = 1, n do
  local id, row = ARGV[3 + j], KEYS[15 + j]
  local deadline = redis.call('ZSCORE', q.active, id)
  if deadline and tonumber(deadline) <= now then
    gone[#gone + 1] = id
    if redis.call('EXISTS', row) == 1 then
      local stalls = redis.call('HINCRBY', row, 'stalls', 1)
      -- the claim's packed copy follows the count
      local packed = run(redis.call('HGET', row, 'run'), nil, stalls)
      if packed then redis.call('HSET', row, 'run', packed) end
      if stalls > max_stalls then
        local err = 'lease expired ' .. stalls .. ' times'
        redis.call('HSET', row, 'state', 'dead', 'error', err, 'finished', now)
        redis.call('HDEL', row, 'traceback')  -- a stall has none; an earlier attempt's misleads
        dead[#dead + 1] = now; dead[#dead + 1] = id
        local g = refs[j] or 0
        if g > 0 then freed[g] = (freed[g] or 0) + 1 end
        local r = redis.call('HMGET', row, 'payload', 'attempts', 'max_attempts', 'parent',
          'parent_queue', 'parent_policy', 'stalls', 'timeout', 'epoch', 'gate')
        -- max_attempts: its own field or run's first word (includes/run.lua)
        local cap = r[3] or (packed and string.match(packed, '^%d+')) or false
        reports[#reports + 1] = {id, err, r[1], r[2], cap, r[4], r[5], r[6], r[7], r[8], r[10]}
        if r[4] then
          local kind = 'f'
          if r[6] == 'id' then kind = 'i' end
          signals[#signals + 1] = signal(kind, id, r[5] or queue, r[4], death(r[9], err))
        end
      else
        back[#back + 1] = 0; back[#back + 1] = id
      end
    end
  end
end
if #gone > 0 then
  redis.call('ZREM', q.active, unpack(gone))
  redis.call('HDEL', q.leases, unpack(gone))
end
claimable(q.pending, q.wake, back)
if #dead > 0 then redis.call('ZADD', q.dead, unpack(dead)) end
push_signals(q.outbox, q.outbox_wake, signals)
for g, count in pairs(freed) do
  gate(q, {KEYS[15 + n + 2 * g - 1], KEYS[15 + n + 2 * g]}, count)
end
return {math.floor(#back / 2), math.floor(#dead / 2), reports}
