#!lua
-- watch: a release watcher takes the flows released after its cursor, at most once.
--
-- KEYS[1] cursor  string  the watcher's cursor: '<release ms>:<parent id>' of the last flow it
--                         took ('<ms>:' when it started, before any flow)
-- ARGV[1] expected        the cursor this reader read ('' : none yet)
-- ARGV[2] next            the cursor after what it takes
-- ARGV[3] ttl             ms the cursor lives after this call
--
-- Steps: compare and set: the cursor moves to ARGV[2] only from ARGV[1], so of two readers
-- (two triggerers, one restarted while the other still ran) that read the same cursor only
-- one takes the flows after it; the other gets the cursor now and reads on from there.
-- Full server: refused before it runs (no allow-oom): it may grow memory, so it writes all or
--  nothing.
-- Owner of what it writes: the cursor expires ARGV[3] ms after its last take or poll (every
-- poll renews it with PEXPIRE): a watcher gone longer than that starts again from its return.
-- Returns: {1, ARGV[2]} taken; {0, the cursor now} another reader moved it first (it may have
-- moved it to ARGV[2] too: it took the same flows).
local now = redis.call('GET', KEYS[1]) or ''
if now ~= ARGV[1] then return {0, now} end
redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
return {1, ARGV[2]}
