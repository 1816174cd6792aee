-- repair_done: the last step of a repair, on the node's slot: every child it listed is back
-- at work (requeue.lua ran on every child queue), so the record of the repair goes; a node
-- with nothing left outstanding (its children's reports arrived while it was cancelled) is
-- released now, as its last settle would have done.
-- @include now_ms
--
-- KEYS[1] row  KEYS[2] repair  KEYS[3] dependencies  KEYS[4] pending  KEYS[5] wake
-- KEYS[6] flows:held  KEYS[7] flows:released
-- ARGV[1] id
-- Owner of what it writes: it deletes :repair; a released root's flows:released entry is moved
-- by close or dropped by the unclosed retention; a pending parent is claimed.
-- Returns: the node's state after the call.
redis.call('DEL', KEYS[2])
redis.call('HDEL', KEYS[1], 'rerun')
local row = redis.call('HMGET', KEYS[1], 'state', 'barrier', 'parent')
local left = tonumber(redis.call('GET', KEYS[3]) or '1')
if row[1] ~= 'held' or left > 0 then return row[1] or '' end
redis.call('ZREM', KEYS[6], ARGV[1])
if row[2] then
  local now = now_ms()
  redis.call('HSET', KEYS[1], 'state', 'released', 'released', now)
  if not row[3] then redis.call('ZADD', KEYS[7], now, ARGV[1]) end
  return 'released'
end
redis.call('HSET', KEYS[1], 'state', 'pending')
redis.call('ZADD', KEYS[4], 0, ARGV[1])
redis.call('ZADD', KEYS[5], 0, 'w')
return 'pending'
