#!lua
-- replay_poison: move poisoned signals back to the tail of their outbox for another try.
-- @include queue_keys
--
-- KEYS[1..15] the queue's keys (includes/queue_keys.lua). Used here: outbox (the signals go
--             back to its tail) and outbox_wake (set when signals were replayed: an idle Pump
--             blocks on it)
-- KEYS[16] poison  list  entries 'reason\n' .. signal
-- KEYS[17] head    hash  the ageing record (cleared, so replayed signals start at zero tries)
-- ARGV[1] count   how many at most, oldest first
-- Full server: refused before it runs (no allow-oom): it may grow memory, so it writes all or
--  nothing.
-- Owner of what it writes: the replayed signals are trimmed from the outbox by the Pump once
-- delivered (or poisoned again, then dropped by the poison retention); the outbox:wake member
-- is popped by an idle Pump.
-- Returns: the number replayed.
local q = queue_keys(KEYS)
local n = 0
for i = 1, tonumber(ARGV[1]) do
  local entry = redis.call('LPOP', KEYS[16])
  if not entry then break end
  local cut = string.find(entry, '\n', 1, true)
  if cut then
    redis.call('RPUSH', q.outbox, string.sub(entry, cut + 1))
    n = n + 1
  end
end
redis.call('DEL', KEYS[17])
if n > 0 then redis.call('ZADD', q.outbox_wake, 0, 'w') end
return n
