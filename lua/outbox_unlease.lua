#!lua flags=allow-oom
-- outbox_unlease: give up a lease of this Pump (to drain an outbox, or to sweep a queue) when
-- it stops cleanly, so the next Pump takes over at once instead of waiting for it to lapse.
--
-- KEYS[1] lease  string  the id of the Pump draining this outbox
-- ARGV[1] pump   this Pump's id
-- Full server: runs (allow-oom): it deletes the Pump's lease and creates none.
-- Owner of what it writes: it creates no key; it deletes this Pump's outbox lease.
-- Returns: 1 released, 0 the lease was not this Pump's (left as it is).
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  return 1
end
return 0
