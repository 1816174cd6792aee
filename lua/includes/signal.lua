-- signal(kind, child_id, parent_queue, parent_id, value): one outbox entry.
-- Five fields joined by newlines; ids and queue names never contain a newline, and the value
-- (a serialised result or an error text) comes last, so it may contain anything.
-- kind: 'c' completed (value = result), 'i' died under ignore-dependency (value = error),
--       'f' died under fail-parent (value = error).
local function signal(kind, child_id, parent_queue, parent_id, value)
  return kind .. '\n' .. child_id .. '\n' .. parent_queue .. '\n' .. parent_id .. '\n' .. value
end
