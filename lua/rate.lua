#!lua flags=no-writes
-- rate: a read; a queue's rate limit and how far ahead of the server's clock its starts are
-- booked.
--
-- KEYS[1] config    hash    the queue's settings: field 'rate' = '<limit> <window ms>' or
--                           '<limit> <window ms> <burst>'
-- KEYS[2] rate:tat  string  the rate's theoretical arrival time, µs (claim.lua)
--
-- Why a script for a read: what is booked is measured against the server's clock (as claim
-- judges it), so the read is made on the queue's slot, where claims take their starts.
-- Returns: false when the queue has no rate limit; else {the 'rate' field, TAT - now in µs
-- (0 when the TAT has passed or the key is gone: nothing is booked, the whole burst may
-- start now)}.
-- Full server: runs (no-writes): it only reads.
-- Owner of what it writes: nothing; a read, it creates no key.
local rate = redis.call('HGET', KEYS[1], 'rate')
if not rate then return false end
local clock = redis.call('TIME')
local now_us = tonumber(clock[1]) * 1000000 + tonumber(clock[2])
local tat = tonumber(redis.call('GET', KEYS[2])) or now_us
return {rate, math.max(0, math.floor(tat - now_us))}
