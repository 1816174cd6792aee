-- due: a read; the ids of leased jobs whose lease deadline has passed, oldest first.
-- @include now_ms
--
-- KEYS[1] active  zset  leased jobs by deadline
-- ARGV[1] limit   how many ids at most
-- Owner of what it writes: nothing; a read, it creates no key.
-- Returns: {id, ...}. Changes nothing (the server's clock decides what is due).
return redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now_ms(), 'LIMIT', 0, tonumber(ARGV[1]))
