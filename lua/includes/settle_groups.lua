-- @include settle
-- settle_groups(groups, key_base, id_base, queue, pq, now): settle the same-queue
-- parent groups of a complete or fail batch. groups[g] = list of {kind, child, value};
-- parent g's six keys are KEYS[key_base + 6(g-1) + 1 .. +6] and its id ARGV[id_base + g].
-- Returns the flat event list ('r' | 'f', parent id) for the host's lifecycle hooks.
local function settle_groups(groups, key_base, id_base, queue, pq, now)
  local events = {}
  for g, items in pairs(groups) do
    local k = key_base + (g - 1) * 6
    local pid = ARGV[id_base + g]
    local _, ev = settle({KEYS[k + 1], KEYS[k + 2], KEYS[k + 3], KEYS[k + 4], KEYS[k + 5],
      KEYS[k + 6]}, pid,
      queue, pq, items, now)
    if ev then events[#events + 1] = ev; events[#events + 1] = pid end
  end
  return events
end
