#!lua flags=no-writes
-- due: a read; the ids of leased jobs whose lease deadline has passed, oldest first.
-- @include now_ms
-- @include queue_keys
--
-- KEYS[1..15] the queue's keys (includes/queue_keys.lua). Used here: active (leased jobs by
--             deadline)
-- ARGV[1] limit   how many ids at most
-- Full server: runs (no-writes): it only reads (the expired leases).
-- Owner of what it writes: nothing; a read, it creates no key.
-- Returns: {id, ...}. Changes nothing (the server's clock decides what is due).
local q = queue_keys(KEYS)
return redis.call('ZRANGEBYSCORE', q.active, '-inf', now_ms(), 'LIMIT', 0, tonumber(ARGV[1]))
