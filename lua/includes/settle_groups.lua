-- @include settle
-- settle_groups(groups, parents, keys, at, queue, q, now): settle the same-queue parent groups
-- of a complete or fail batch. groups[g] = list of {kind, child, value}; parents[g] = group g's
-- parent id (batch.lua); keys = the script's KEYS, where group g's seven parent keys (settle's pk)
-- are keys[at + 7(g-1) + 1 .. +7]; q = the queue's keys (queue_keys.lua).
-- Returns the flat event list ('r' | 'f', parent id) for the host's lifecycle hooks.
-- Owner of what it writes: it writes only through settle (settle_current.lua names the owners:
-- the parent's records and settle log go with the flow's expiry, drop_node.lua).
local function settle_groups(groups, parents, keys, at, queue, q, now)
  local events = {}
  for g, items in pairs(groups) do
    local k = at + (g - 1) * 7
    local pid = parents[g]
    local _, ev = settle({unpack(keys, k + 1, k + 7)}, pid, queue, q, items, now)
    if ev then events[#events + 1] = ev; events[#events + 1] = pid end
  end
  return events
end
