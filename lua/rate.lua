#!lua flags=no-writes
-- rate: a read; a queue's rate limit and how much of its current window is used.
-- @include now_ms
--
-- KEYS[1] config       hash    the queue's settings: field 'rate' = '<limit> <window ms>'
-- KEYS[2] rate:window  hash    the current rate window (claim.lua): 'start' and 'count'
--
-- Why a script for a read: the window that is current is decided by the server's clock
-- (as claim decides it), so the read is made on the queue's slot, where claims count.
-- Returns: false when the queue has no rate limit; else {'<limit> <window ms>', starts in
-- the current window, ms until it ends (0 when no start was counted in it)}.
-- Full server: runs (no-writes): it only reads.
-- Owner of what it writes: nothing; a read, it creates no key.
local rate = redis.call('HGET', KEYS[1], 'rate')
if not rate then return false end
local w = tonumber(string.match(rate, ' (%d+)$'))
local now = now_ms()
local start = now - now % w
local win = redis.call('HMGET', KEYS[2], 'start', 'count')
if tonumber(win[1]) ~= start then return {rate, 0, 0} end
return {rate, tonumber(win[2]), start + w - now}
