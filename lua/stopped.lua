#!lua
-- stopped: the last step of a threshold flow's follow-up (lifecycle.stop_unstarted): its
-- children that had not started were cancelled on every child queue, so the row records it.
--
-- KEYS[1] row   the failed flow node's row
-- ARGV[1] mark  the row's `tipped` value the follow-up acted on (settle_current.lua)
-- Steps: `stopped` = mark, only while `tipped` still equals it: a repair (repair.lua drops
-- `tipped`) or an expired row is left as it is, so this never recreates a row.
-- Full server: refused before it runs (no allow-oom): it may grow memory, so it writes all or
--  nothing.
-- Owner of what it writes: the `stopped` field goes with the row (or with repair.lua).
-- Returns: 1 recorded, 0 the row no longer holds that failure.
if redis.call('HGET', KEYS[1], 'tipped') ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[1], 'stopped', ARGV[1])
return 1
