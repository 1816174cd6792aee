#!lua
-- repair_done: the last step of a repair, on the node's slot: every child it listed is back
-- at work (requeue.lua ran on every child queue), so the record of the repair goes; a node
-- with nothing left outstanding (its children's reports arrived while it was cancelled) is
-- released now, as its last settle would have done.
-- @include now_ms
-- @include queue_keys
-- @include claimable
--
-- KEYS[1..15] the queue's keys (includes/queue_keys.lua). Used here: flows_held (a root leaves
--             it), flows_released (a released barrier root), pending and wake (a released
--             worker-run parent)
-- KEYS[16] row  KEYS[17] repair  KEYS[18] dependencies  the node's keys
-- ARGV[1] id
-- Full server: refused before it runs (no allow-oom): it may grow memory, so it writes all or
--  nothing.
-- Owner of what it writes: it deletes :repair; a released root's flows:released entry is moved
-- by close or dropped by the unclosed retention; a pending parent is claimed.
-- Returns: the node's state after the call.
local q = queue_keys(KEYS)
redis.call('DEL', KEYS[17])
redis.call('HDEL', KEYS[16], 'rerun')
local row = redis.call('HMGET', KEYS[16], 'state', 'barrier', 'parent')
local left = tonumber(redis.call('GET', KEYS[18]) or '1')
if row[1] ~= 'held' or left > 0 then return row[1] or '' end
redis.call('ZREM', q.flows_held, ARGV[1])
if row[2] then
  local now = now_ms()
  redis.call('HSET', KEYS[16], 'state', 'released', 'released', now)
  if not row[3] then redis.call('ZADD', q.flows_released, now, ARGV[1]) end
  return 'released'
end
redis.call('HSET', KEYS[16], 'state', 'pending')
claimable(q.pending, q.wake, {0, ARGV[1]})
return 'pending'
