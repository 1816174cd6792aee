-- cancel: cancel one node of a flow (the root, or an inner node the host reached): no child
-- of it that has not started will start; what running children report changes nothing.
-- @include now_ms
-- @include flow_node
--
-- KEYS[1] row       KEYS[2] pending  KEYS[3] active  KEYS[4] leases  this queue's job sets
-- KEYS[5..9] flows:held, flows:released, flows:closed, flows:failed, flows:cancelled
-- KEYS[10] explicit  the node's explicit-id record (child id -> queue)
-- KEYS[11] completed the queue's finished jobs
-- ARGV[1] id  ARGV[2] reason  ARGV[3] its parent ('' for a root: the caller names the root)
--
-- Steps: a held, released or failed node (or a worker-run parent not yet run: it leaves
-- pending, or loses its lease if a worker holds it) becomes 'cancelled' with the reason and
-- the time; a root moves to flows:cancelled (its `cancelled` retention). Cancelling again
-- changes nothing, and a flow that already ended otherwise (closed, completed, dead) is left
-- as it is. Its children are reached by the host, queue by queue (cancel_children.lua).
-- Owner of what it writes: the row and the flows:cancelled entry go with the flow's expiry.
-- Returns: {state after, total, child queues, {explicit id, queue, ...}, state before, gen}.
-- Errors: EMQNOJOB no such node; EMQFLOW a plain job, or a node that is not the root named.
local row, refused = flow_node(KEYS[1], ARGV[1], ARGV[3], 'cancel', {'cq', 'gen'})
if refused then return refused end
local state = row[1]
local before = state
if state == 'pending' and redis.call('ZSCORE', KEYS[11], ARGV[1]) then state = 'completed' end
if state == 'held' or state == 'released' or state == 'failed' or state == 'pending' then
  local now = now_ms()
  if state == 'pending' then
    redis.call('ZREM', KEYS[2], ARGV[1])
    if redis.call('ZREM', KEYS[3], ARGV[1]) == 1 then redis.call('HDEL', KEYS[4], ARGV[1]) end
  end
  redis.call('HSET', KEYS[1], 'state', 'cancelled', 'reason', ARGV[2], 'cancelled', now,
    'cancelled_from', state)
  for i = 5, 8 do redis.call('ZREM', KEYS[i], ARGV[1]) end
  if ARGV[3] == '' then redis.call('ZADD', KEYS[9], now, ARGV[1]) end
  state = 'cancelled'
end
return {state, row[2], row[5] or '', redis.call('HGETALL', KEYS[10]), before, row[6] or ''}
