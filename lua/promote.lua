#!lua
-- promote: move delayed jobs whose due time has come into pending.
-- @include now_ms
-- @include queue_keys
-- @include claimable
--
-- KEYS[1..15] the queue's keys (includes/queue_keys.lua). Used here: delayed (jobs by due
--             time), pending and wake (the due ones are claimable)
-- ARGV[1] limit    how many at most
-- Steps: one ZRANGEBYSCORE, one ZADD at the front of pending (score 0: a retry has waited
-- its backoff already), one ZREM.
-- Full server: refused before it runs (no allow-oom): it may grow memory, so it writes all or
--  nothing.
-- Owner of what it writes: the pending entries are claimed (claim.lua); the wake member is
-- popped by idle workers.
-- Returns: the number promoted.
local q = queue_keys(KEYS)
local now = now_ms()
local due = redis.call('ZRANGEBYSCORE', q.delayed, '-inf', now, 'LIMIT', 0, tonumber(ARGV[1]))
if #due == 0 then return 0 end
local add, ids = {}, {}
for i = 1, #due do
  add[#add + 1] = 0; add[#add + 1] = due[i]
  ids[#ids + 1] = due[i]
end
redis.call('ZREM', q.delayed, unpack(ids))
claimable(q.pending, q.wake, add)
return #ids
