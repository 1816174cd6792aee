-- push_signals(outbox, outbox_wake, signals): append signals to an outbox and set its wake-up
-- hint (an idle Pump blocks on it). Every script that pushes a signal pushes it here; nothing
-- is written when `signals` is empty.
-- Owner of what it writes: the signals are trimmed by the Pump once delivered (trim_outbox.lua);
-- the outbox:wake member is popped by an idle Pump.
local function push_signals(outbox, outbox_wake, signals)
  if #signals == 0 then return end
  redis.call('RPUSH', outbox, unpack(signals))
  redis.call('ZADD', outbox_wake, 0, 'w')
end
