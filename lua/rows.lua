#!lua flags=no-writes
-- rows: a read; the fields a worker needs of each claimed job, in one reply.
--
-- KEYS[1..n] the rows of the claimed jobs
-- ARGV[1..]  the field names to read from each row
-- Why a script for a read: one reply of n rows costs the client one parse instead of n, which
-- is most of a claim's client-side cost for small jobs (the server runs the same n HMGETs).
-- Full server: runs (no-writes): it only reads.
-- Owner of what it writes: nothing; a read, it creates no key.
-- Returns: {{values of row 1}, {values of row 2}, ...}, each in ARGV order (false if absent).
local out = {}
for i = 1, #KEYS do
  out[i] = redis.call('HMGET', KEYS[i], unpack(ARGV))
end
return out
