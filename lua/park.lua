#!lua
-- park: on one child queue's slot, the first step of a tipped threshold flow's follow-up
-- (lifecycle.stop_unstarted): its children there that are pending or retrying can no longer
-- be claimed (includes/park.lua), before the cancel walk marks them.
-- @include queue_keys
-- @include park
--
-- KEYS[1..15] the queue's keys (includes/queue_keys.lua). Used here: pending and delayed
-- KEYS[16] KEYS[17]  the gate (waiting, cap) of the flow's children in this queue
--             (includes/gate.lua; absent keys when the flow has no cap): marked off
-- ARGV[1] stem  the flow's derived-id prefix ('<id>.' or '<id>.g<gen>.')
-- ARGV[2] from  ARGV[3] to  the derived indexes [from, to) to park (from = to: none)
-- ARGV[4..] explicit child ids of this queue (from the flow's :explicit record)
-- The host sends derived ids only for a flow without explicit ids (see includes/park.lua) and
-- at most lifecycle.PARK_CHUNK ids per call.
-- Full server: refused before it runs (no allow-oom): it may grow memory, so it writes all or
--  nothing.
-- Owner of what it writes: see includes/park.lua (cancel_children.lua removes the parked
-- entries in the same follow-up).
-- Returns: how many children were parked.
local ids = {unpack(ARGV, 4)}
return park(queue_keys(KEYS), ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), ids,
  {KEYS[16], KEYS[17]})
