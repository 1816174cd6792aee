-- signal(kind, child_id, parent_queue, parent_id, value): one outbox entry.
-- Five fields joined by newlines; ids and queue names never contain a newline, and the value
-- (a serialised result or an error text) comes last, so it may contain anything.
-- kind: 'c' completed (value = result), 'i' died under ignore-dependency (value = error),
--       'f' died under fail-parent (value = error).
local function signal(kind, child_id, parent_queue, parent_id, value)
  return kind .. '\n' .. child_id .. '\n' .. parent_queue .. '\n' .. parent_id .. '\n' .. value
end

-- push_signals(outbox, outbox_wake, signals): append signals to an outbox and set its wake-up
-- hint (an idle Pump blocks on it; its one member is popped by that Pump). Every script that
-- pushes a signal pushes it here.
local function push_signals(outbox, outbox_wake, signals)
  if #signals == 0 then return end
  redis.call('RPUSH', outbox, unpack(signals))
  redis.call('ZADD', outbox_wake, 0, 'w')
end

-- death(epoch, err): what a dying child reports (the value of an 'i' or 'f' record): its error,
-- prefixed with its repair epoch when a repair re-ran it ("\1<epoch>\1<error>"), so its parent
-- can tell a report of this run from a stale one of a run before the repair (settle.lua).
local function death(epoch, err)
  if epoch then return '\1' .. epoch .. '\1' .. err end
  return err
end
