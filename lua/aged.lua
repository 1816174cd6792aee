-- aged: a read; ids in a time-scored set whose score is older than now minus `age_ms`.
-- @include now_ms
--
-- KEYS[1] a zset scored by time in ms (completed)
-- ARGV[1] age_ms  ARGV[2] limit
-- Returns: {id, ...}, oldest first. Changes nothing.
return redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now_ms() - tonumber(ARGV[1]), 'LIMIT', 0,
  tonumber(ARGV[2]))
