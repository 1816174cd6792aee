#!lua
-- deliver: the Pump's parent-slot half; settle outbox signals on their parents' slot.
-- @include now_ms
-- @include queue_keys
-- @include settle
--
-- KEYS[1..15] the PARENT queue's keys (includes/queue_keys.lua). Used here: pending and wake
--             (a released parent), outbox and outbox_wake (a failed parent that has a parent
--             of its own signals upward through them), flows_held, flows_released and
--             flows_failed (a root moves between them)
-- KEYS[15+7(g-1)+1 .. +7]  parent g: row, dependencies, processed, unsuccessful, failed,
--             explicit, log (the settle log: written only for a flow added with stream=True)
-- ARGV[1] parent_queue   the parents' queue name
-- ARGV[2] g              number of parents
-- ARGV[3..] per parent: its id, m (its number of signals), kinds (m bytes: the kind of each
--   signal, 'c' | 'i' | 'f'), then m pairs: child id, value
--
-- Steps: for each parent, settle its signals in one group (its completions recorded by one
-- HMGET and one HSET, a death by HSETNX, one DECRBY, release at 0, fail on an 'f' - see
-- settle_current). Redelivering any signal any number of times changes nothing: only a first
-- record decrements.
-- Full server: refused before it runs (no allow-oom): it may grow memory, so it writes all or
--  nothing.
-- Owner of what it writes: the parents' records and counters (and a released parent's index
-- entry, a failed one's outbox signal upward) go with their flow's expiry; see settle.lua; the
-- outbox:wake member is popped by an idle Pump.
-- Returns: {statuses, events}. statuses: one per signal, in ARGV order: 1 recorded, 0 already
-- recorded (both count as delivered), -1 the parent does not exist (not delivered; the Pump
-- ages it). events: flat pairs ('r' | 'f', parent id) released or failed by this call.
local q = queue_keys(KEYS)
local now = now_ms()
local queue, g = ARGV[1], tonumber(ARGV[2])
local out, events = {}, {}
local a = 3
for gi = 1, g do
  local pid, m, kinds = ARGV[a], tonumber(ARGV[a + 1]), ARGV[a + 2]
  a = a + 3
  local items = {}
  for j = 1, m do
    items[j] = {string.sub(kinds, j, j), ARGV[a], ARGV[a + 1]}
    a = a + 2
  end
  local k = 15 + (gi - 1) * 7
  local st, ev = settle({unpack(KEYS, k + 1, k + 7)}, pid, queue, q, items, now)
  for j = 1, m do out[#out + 1] = st[j] end
  if ev then events[#events + 1] = ev; events[#events + 1] = pid end
end
return {out, events}
