#!lua
-- outbox_lease: take or renew the right to drain one queue's outbox.
-- @include queue_keys
--
-- KEYS[1..15] the queue's keys (includes/queue_keys.lua). Used here: outbox (its length)
-- KEYS[16] lease  string  the id of the Pump draining this outbox now
-- ARGV[1] pump    this Pump's id
-- ARGV[2] ttl_ms  how long the right lasts without renewal
-- Why: two Pumps reading the same page would both trim it, and the second trim would drop
-- signals it never delivered. One Pump drains an outbox at a time; if it dies, the lease
-- lapses and another takes over after ttl_ms. (trim_outbox re-checks the lease and the head,
-- so a Pump that paused past its lease trims nothing.) An empty outbox is left alone: an idle
-- Pump takes or renews no lease, it writes nothing. (The page itself is read by an LRANGE
-- pipelined behind this call: a plain read, cheaper than passing 1,000 entries through Lua.)
-- Full server: refused before it runs (no allow-oom): it may grow memory, so it writes all or
--  nothing.
-- Owner of what it writes: the lease expires by itself (PX) and is given up by a stopping Pump
-- (outbox_unlease.lua).
-- Returns: 1 held by this Pump (taken or renewed), 2 held by another (whether or not there is
-- anything to drain: a drainer that is not the holder does not wait on the outbox's wake-up
-- hint, so the hint reaches the holder), 0 free and nothing to drain.
local q = queue_keys(KEYS)
if redis.call('LLEN', q.outbox) == 0 then
  local holder = redis.call('GET', KEYS[16])
  if holder and holder ~= ARGV[1] then return 2 end
  return 0
end
if redis.call('SET', KEYS[16], ARGV[1], 'NX', 'PX', tonumber(ARGV[2])) then return 1 end
if redis.call('GET', KEYS[16]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[16], tonumber(ARGV[2]))
  return 1
end
return 2
