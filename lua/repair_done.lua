-- repair_done: the last step of a repair, on the node's slot: every child it listed is back
-- at work (requeue.lua ran on every child queue), so the record of the repair goes.
--
-- KEYS[1] row  KEYS[2] repair
-- Returns: 1.
redis.call('DEL', KEYS[2])
redis.call('HDEL', KEYS[1], 'rerun')
return 1
