-- requeue: on one child queue's slot, put the children a repair re-runs back to pending.
--
-- KEYS[1] pending  KEYS[2] dead  KEYS[3] wake  KEYS[4] seq  this queue's sets and counter
-- KEYS[4+i] the row of candidate child i
-- ARGV[1] parent  the repaired node's id
-- ARGV[2] rerun   '1': also re-run children that were cancelled (a repaired cancelled flow)
-- then the candidate child ids (the node's :repair entries, and with `rerun` its derived and
-- explicit ids; one without a row here, or with another parent, is skipped)
--
-- Steps: a dead child (or, with rerun, a cancelled one) of `parent` gets fresh attempts
-- (attempts and stalls 0, its state and error cleared), leaves the morgue and becomes
-- claimable, in the order given. Any other child is left as it is: one requeued already (a
-- repair retried), one that completed (its value stays, it never runs again). A child that is
-- a parent itself is named in the reply: the host repairs it (repair.lua) and its children.
-- Owner of what it writes: pending entries are claimed; the rows' fields (attempts, epoch) go
-- with their flow's expiry; the seq counter is the queue's own (one per queue); the wake member
-- is popped by idle workers.
-- Returns: {requeued, {inner node ids}}.
local n = #ARGV - 2
local seq = redis.call('INCRBY', KEYS[4], n) - n
local requeued, inner, ready = 0, {}, {}
for i = 3, #ARGV do
  local id, row = ARGV[i], KEYS[2 + i]
  local r = redis.call('HMGET', row, 'parent', 'total', 'state')
  if r[1] == ARGV[1] then
    if r[2] then
      -- a sub-flow to repair in turn (one that completed, or is being run, is left alone)
      if r[3] == 'failed' or r[3] == 'cancelled' or r[3] == 'held' then
        inner[#inner + 1] = id
      end
    elseif r[3] == 'dead' or (r[3] == 'cancelled' and ARGV[2] == '1') then
      redis.call('HSET', row, 'attempts', 0, 'stalls', 0)
      if r[3] == 'dead' then redis.call('HINCRBY', row, 'epoch', 1) end  -- see repair.lua
      redis.call('HDEL', row, 'state', 'error', 'traceback', 'finished', 'cancelled')
      redis.call('ZREM', KEYS[2], id)
      ready[#ready + 1] = seq + i; ready[#ready + 1] = id
      requeued = requeued + 1
    end
  end
end
if #ready > 0 then
  redis.call('ZADD', KEYS[1], unpack(ready))
  redis.call('ZADD', KEYS[3], 0, 'w')
end
return {requeued, inner}
