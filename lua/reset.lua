#!lua
-- reset: the last step of taking an old flow away so a new one can be held under the same id
-- (add_flow replace=True), on the root's slot. The host has cancelled the old flow and deleted
-- its children's rows in every queue (forget.lua) first, while this root still named them.
-- @include drop_node
-- @include queue_keys
--
-- KEYS[1..15] the queue's keys (includes/queue_keys.lua). Used here: completed, dead and the
--             five flows_* indexes (the root's entries go)
-- KEYS[16..23] the root's row, dependencies, processed, unsuccessful, failed, explicit, repair,
--               log
-- KEYS[24] flows_completed  zset  worker-run roots that completed (a completed root's entry
--          goes; see complete.lua)
-- ARGV[1] id
-- Steps: a cancelled root's keys (or an ended one's: closed, completed, dead) go, as when a
-- flow expires, and its row is left holding only state 'replaced' and the next generation
-- n+1, which hold.lua takes over (so a retried replace that was cut after this step still adds
-- generation n+1). A root already 'replaced' is left as it is.
-- Full server: refused before it runs (no allow-oom): it may grow memory, so it writes all or
--  nothing.
-- Owner of what it writes: the 'replaced' row is overwritten by the new flow's hold (and
-- expires by itself after 7 days if no add follows).
-- Returns: the next generation.
-- Errors: EMQFLOW the root is neither cancelled nor replaced.
local q = queue_keys(KEYS)
local row = redis.call('HMGET', KEYS[16], 'state', 'gen')
local state = row[1]
if state == 'replaced' then return row[2] end
if state == 'pending' and redis.call('ZSCORE', q.completed, ARGV[1]) then state = 'completed' end
if state ~= 'cancelled' and state ~= 'closed' and state ~= 'completed' and state ~= 'dead' then
  return redis.error_reply('EMQFLOW flow ' .. ARGV[1] .. ' is ' .. tostring(state) ..
    ': cancel it before it is replaced')
end
local gen = tostring(tonumber(row[2] or '0') + 1)
local idx = {q.completed, q.dead, q.flows_held, q.flows_released, q.flows_closed, q.flows_failed,
  q.flows_cancelled, KEYS[24]}
drop_node({unpack(KEYS, 16, 23)}, idx, ARGV[1])
redis.call('HSET', KEYS[16], 'state', 'replaced', 'gen', gen)
redis.call('PEXPIRE', KEYS[16], 7 * 86400000)  -- a replace nobody finishes leaves no key for ever
return gen
