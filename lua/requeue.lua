#!lua
-- requeue: on one child queue's slot, put the children a repair re-runs back to pending.
-- @include queue_keys
-- @include claimable
-- @include gate
-- @include run
--
-- KEYS[1..15] the queue's keys (includes/queue_keys.lua). Used here: dead (the morgue), pending
--             and wake (requeued children), seq (the arrival counter)
-- KEYS[16] KEYS[17]  the gate (waiting, cap) of the node's children in this queue
--             (includes/gate.lua; absent keys when the node has no cap)
-- KEYS[17+j]  the row of candidate child j (ARGV[2+j])
-- ARGV[1] parent  the repaired node's id
-- ARGV[2] which   '': re-run dead children; '1': dead and cancelled ones; 'c': cancelled ones
--         only (the host names its :repair entries with '1', and for a repaired cancelled or
--         tipped node the rest of its derived and explicit ids with 'c': a dead child that is not
--         in :repair died without its report recorded yet - the report is on its way and counts
--         when it arrives, so running it again would count it twice)
-- then the candidate child ids (one without a row here, or with another parent, is skipped)
--
-- Steps: a dead child (or, with rerun, a cancelled one) of `parent` gets fresh attempts
-- (attempts and stalls 0, its state and error cleared), leaves the morgue and becomes
-- claimable, in the order given, scored by its priority (the row's) - a gated child through
-- its gate again (the repair takes the cancel's 'off' away; the gate admits what fits). Any
-- other child is left as it is: one requeued already (a
-- repair retried), one that completed (its value stays, it never runs again). A child that is
-- a parent itself is named in the reply: the host repairs it (repair.lua) and its children.
-- Full server: refused before it runs (no allow-oom): it may grow memory, so it writes all or
--  nothing.
-- Owner of what it writes: pending entries are claimed; the rows' fields (attempts, stalls,
-- their copy in 'run', epoch) go
-- with their flow's expiry; the seq counter is the queue's own (one per queue); the wake member
-- is popped by idle workers.
-- The gate's count and the children it admits: see includes/gate.lua (its keys go with the flow).
-- Returns: {requeued, {inner node ids}}.
local q = queue_keys(KEYS)
local n = #ARGV - 2
local seq = redis.call('INCRBY', q.seq, n) - n
local requeued, inner, ready, waiting = 0, {}, {}, {}
local gk = {KEYS[16], KEYS[17]}
for j = 1, n do
  local i = 2 + j
  local id, row = ARGV[i], KEYS[17 + j]
  local r = redis.call('HMGET', row, 'parent', 'total', 'state', 'priority', 'gate', 'run')
  if r[1] == ARGV[1] then
    if r[2] then
      -- a sub-flow to repair in turn (one that completed, or is being run, is left alone)
      if r[3] == 'failed' or r[3] == 'cancelled' or r[3] == 'held' then
        inner[#inner + 1] = id
      end
    elseif (r[3] == 'dead' and ARGV[2] ~= 'c') or (r[3] == 'cancelled' and ARGV[2] ~= '') then
      local packed = run(r[6], 0, 0)  -- the claim's copy (includes/run.lua), if the row has one
      if packed then
        redis.call('HSET', row, 'attempts', 0, 'stalls', 0, 'run', packed)
      else
        redis.call('HSET', row, 'attempts', 0, 'stalls', 0)
      end
      if r[3] == 'dead' then redis.call('HINCRBY', row, 'epoch', 1) end  -- see repair.lua
      redis.call('HDEL', row, 'state', 'error', 'traceback', 'finished', 'cancelled')
      redis.call('ZREM', q.dead, id)
      local into = ready
      if r[5] then into = waiting end
      into[#into + 1] = tonumber(r[4] or '0') * 1099511627776 + seq + i; into[#into + 1] = id
      requeued = requeued + 1
    end
  end
end
claimable(q.pending, q.wake, ready)
if #waiting > 0 then
  redis.call('ZADD', gk[1], unpack(waiting))
  redis.call('HDEL', gk[2], 'off')
  gate(q, gk, 0)
end
return {requeued, inner}
