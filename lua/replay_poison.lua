-- replay_poison: move poisoned signals back to the tail of their outbox for another try.
--
-- KEYS[1] poison  list  entries 'reason\n' .. signal
-- KEYS[2] outbox  list  the same queue's flow:outbox
-- KEYS[3] head    hash  the ageing record (cleared, so replayed signals start at zero tries)
-- KEYS[4] outbox:wake zset set when signals were replayed (an idle Pump blocks on it)
-- ARGV[1] count   how many at most, oldest first
-- Owner of what it writes: the replayed signals are trimmed from the outbox by the Pump once
-- delivered (or poisoned again, then dropped by the poison retention); the outbox:wake member
-- is popped by an idle Pump.
-- Returns: the number replayed.
local n = 0
for i = 1, tonumber(ARGV[1]) do
  local entry = redis.call('LPOP', KEYS[1])
  if not entry then break end
  local cut = string.find(entry, '\n', 1, true)
  if cut then
    redis.call('RPUSH', KEYS[2], string.sub(entry, cut + 1))
    n = n + 1
  end
end
redis.call('DEL', KEYS[3])
if n > 0 then redis.call('ZADD', KEYS[4], 0, 'w') end
return n
