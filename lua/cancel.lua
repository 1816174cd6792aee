#!lua
-- cancel: cancel one node of a flow (the root, or an inner node the host reached): no child
-- of it that has not started will start; what running children report changes nothing.
-- @include now_ms
-- @include flow_node
-- @include queue_keys
--
-- KEYS[1..15] the queue's keys (includes/queue_keys.lua). Used here: pending, delayed, active
--             and leases (a worker-run parent not yet run leaves them), completed (read), the
--             five flows_* indexes (a root leaves its index for flows_cancelled)
-- KEYS[16] row       the node's row
-- KEYS[17] explicit  the node's explicit-id record (child id -> queue)
-- ARGV[1] id  ARGV[2] reason  ARGV[3] its parent ('' for a root: the caller names the root)
--
-- Steps: a held, released or failed node (or a worker-run parent not yet run, or a job in the
-- first run that spawned children of its own - 'active', spawn.lua: it leaves pending or
-- delayed, or loses its lease if a worker holds it) becomes 'cancelled' with the
-- reason and the time; a root moves to flows:cancelled (its `cancelled` retention).
-- Cancelling again changes nothing, and a flow that already ended otherwise (closed,
-- completed, dead) is left as it is. Its children are reached by the host, queue by queue
-- (cancel_children.lua): those of a cancelled node, and those of a dead one (a job that
-- spawned children of its own and died: they run on without it until a cancel reaches them).
-- Full server: refused before it runs (no allow-oom): it may grow memory, so it writes all or
--  nothing.
-- Owner of what it writes: the row and the flows:cancelled entry go with the flow's expiry.
-- Returns: {state after, total, child queues, {explicit id, queue, ...}, state before, gen}.
-- Errors: EMQNOJOB no such node; EMQFLOW a plain job, or a node that is not the root named.
local q = queue_keys(KEYS)
local row, refused = flow_node(KEYS[16], ARGV[1], ARGV[3], 'cancel', {'cq', 'gen'})
if refused then return refused end
local state = row[1]
local before = state
if state == 'pending' and redis.call('ZSCORE', q.completed, ARGV[1]) then state = 'completed' end
if state == 'held' or state == 'released' or state == 'failed' or state == 'pending' or
    state == 'active' then
  local now = now_ms()
  if state == 'pending' or state == 'active' then
    -- pending, or in delayed: retrying its own run, or parked by a threshold tip (park.lua)
    redis.call('ZREM', q.pending, ARGV[1])
    redis.call('ZREM', q.delayed, ARGV[1])
    if redis.call('ZREM', q.active, ARGV[1]) == 1 then redis.call('HDEL', q.leases, ARGV[1]) end
  end
  redis.call('HSET', KEYS[16], 'state', 'cancelled', 'reason', ARGV[2], 'cancelled', now,
    'cancelled_from', state)
  for _, index in ipairs({q.flows_held, q.flows_released, q.flows_closed, q.flows_failed}) do
    redis.call('ZREM', index, ARGV[1])
  end
  if ARGV[3] == '' then redis.call('ZADD', q.flows_cancelled, now, ARGV[1]) end
  state = 'cancelled'
end
return {state, row[2], row[5] or '', redis.call('HGETALL', KEYS[17]), before, row[6] or ''}
