-- promote: move delayed jobs whose due time has come into pending.
-- @include now_ms
--
-- KEYS[1] delayed  zset  jobs by due time
-- KEYS[2] pending  zset  claimable jobs
-- KEYS[3] wake     zset  set when jobs become claimable (idle workers block on it)
-- ARGV[1] limit    how many at most
-- Steps: one ZRANGEBYSCORE, one ZADD at the front of pending (score 0: a retry has waited
-- its backoff already), one ZREM.
-- Owner of what it writes: the pending entries are claimed (claim.lua); the wake member is
-- popped by idle workers.
-- Returns: the number promoted.
local now = now_ms()
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, tonumber(ARGV[1]))
if #due == 0 then return 0 end
local add, ids = {}, {}
for i = 1, #due do
  add[#add + 1] = 0; add[#add + 1] = due[i]
  ids[#ids + 1] = due[i]
end
redis.call('ZADD', KEYS[2], unpack(add))
redis.call('ZREM', KEYS[1], unpack(ids))
redis.call('ZADD', KEYS[3], 0, 'w')
return #ids
