-- outbox_lease: take or renew the right to drain one queue's outbox, and read its head page.
--
-- KEYS[1] lease   string  the id of the Pump draining this outbox now
-- KEYS[2] outbox  list    this queue's flow:outbox
-- ARGV[1] pump    this Pump's id
-- ARGV[2] ttl_ms  how long the right lasts without renewal
-- ARGV[3] page    how many signals to read from the head
-- Why: two Pumps reading the same page would both trim it, and the second trim would drop
-- signals it never delivered. One Pump drains an outbox at a time; if it dies, the lease
-- lapses and another takes over after ttl_ms. (trim_outbox re-checks the lease and the head,
-- so a Pump that paused past its lease trims nothing.) An empty outbox is left alone: an idle
-- Pump writes nothing (no lease taken or renewed), it only reads the length.
-- Returns: the head page (up to `page` signals) when this Pump holds the lease (taken or
-- renewed); an empty list when the outbox is empty or another Pump holds it.
if redis.call('LLEN', KEYS[2]) == 0 then return {} end
if not redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', tonumber(ARGV[2])) then
  if redis.call('GET', KEYS[1]) ~= ARGV[1] then return {} end
  redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[2]))
end
return redis.call('LRANGE', KEYS[2], 0, tonumber(ARGV[3]) - 1)
