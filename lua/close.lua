#!lua
-- close: a reader is done with a released barrier flow; from now on its retention runs.
-- @include now_ms
-- @include flow_node
-- @include queue_keys
--
-- KEYS[1..15] the queue's keys (includes/queue_keys.lua). Used here: flows_released (released
--             barrier flows not yet closed), flows_closed (closed flows by close time: the
--             `closed` retention), completed (read: a worker-run root that ran)
-- KEYS[16] row  hash  the parent's row
-- ARGV[1] id              the parent id
--
-- Steps: a released root moves to flows:closed (state 'closed', stamped); closing again, or
-- closing a root that already ended otherwise (failed, completed by a worker, dead), changes
-- nothing: retention for that end state is already running. Idempotent: safe to retry.
-- Full server: refused before it runs (no allow-oom): it may grow memory, so it writes all or
--  nothing.
-- Owner of what it writes: the flows:closed entry and the row go with the flow's expiry.
-- Returns: the state after the call: 'closed' | 'failed' | 'completed' | 'dead' | 'cancelled'.
-- Errors: EMQNOJOB no such parent; EMQFLOW a held flow (cancel it instead), a job that is not
-- a flow parent, or a node that is not a root (its root is closed as a whole).
local q = queue_keys(KEYS)
local row, refused = flow_node(KEYS[16], ARGV[1], '', 'close', {})
if refused then return refused end
local state = row[1]
if state == 'released' then
  local now = now_ms()
  redis.call('HSET', KEYS[16], 'state', 'closed', 'closed', now)
  redis.call('ZREM', q.flows_released, ARGV[1])
  redis.call('ZADD', q.flows_closed, now, ARGV[1])
  return 'closed'
end
if state == 'held' then
  return redis.error_reply('EMQFLOW flow ' .. ARGV[1] .. ' is held (children outstanding): ' ..
    'cancel it, or wait for its release')
end
if state == 'pending' then
  if redis.call('ZSCORE', q.completed, ARGV[1]) then return 'completed' end
  return redis.error_reply('EMQFLOW flow ' .. ARGV[1] .. ' is run by a worker: its ' ..
    'completion starts its retention')
end
return state
