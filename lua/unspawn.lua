#!lua
-- unspawn: settle, as never landed, children that an earlier run of a spawner counted and never
-- landed, once a later run of it has settled having spawned fewer (a handler that does not
-- spawn the same children every time: a crawl whose page changed between two runs). On the
-- counting node's slot: the parent (siblings) or the spawner itself (own children).
-- @include now_ms
-- @include queue_keys
-- @include settle
--
-- KEYS[1..15] the node queue's keys (includes/queue_keys.lua): what a release or failure of the
--             node moves (settle_current.lua)
-- KEYS[16..22] the node's row, dependencies, processed, unsuccessful, failed, explicit, log
-- ARGV[1] node     the counting node's id  ARGV[2] its queue
-- ARGV[3] spawner  the spawner's id (for the reason recorded)
-- ARGV[4..] ids    ids <stem>i past what the settled run spawned, that the host found recorded
--                  in the explicit record and without a row on their queues' slots
--
-- Steps: each id still recorded in the explicit record and not settled yet (a zombie run of the
-- spawner may have landed it since the host looked, and it may even have run: then it is
-- left to its own report) is settled as an ignored death with the reason "never landed"
-- (settle.lua: the counter goes down, the node is released at 0 as by any report, a stream's
-- log gets the entry), and gets a row field 'v:<id>' (the row's `voids` counts them): settle.lua
-- drops every later report of it, so a zombie run that lands it after this runs it for nothing
-- and counts nothing. The settled run is recorded before this is called (its lease was current
-- then), so no later run of the spawner can spawn again (a zombie's spawn of a voided id finds
-- it recorded: spawn.lua counts nothing).
-- Full server: refused before it runs (no allow-oom): it may grow memory, so it writes all or
--  nothing.
-- Owner of what it writes: the records, the row's fields and the settle log go with the flow's
-- expiry (drop_node.lua), as settle_current.lua's; what a release moves, as settle_current.lua.
-- Returns: {how many were settled so, event ('r' | 'f' | false)}.
local q = queue_keys(KEYS)
local pk = {KEYS[16], KEYS[17], KEYS[18], KEYS[19], KEYS[20], KEYS[21], KEYS[22]}
local items = {}
local reason = 'never landed: an earlier run of ' .. ARGV[3] ..
  ' counted it, and the run that settled did not spawn it'
for i = 4, #ARGV do
  local id = ARGV[i]
  if redis.call('HEXISTS', pk[6], id) == 1 and redis.call('HEXISTS', pk[1], 'v:' .. id) == 0
      and redis.call('HEXISTS', pk[3], id) == 0 and redis.call('HEXISTS', pk[4], id) == 0
      and redis.call('HEXISTS', pk[5], id) == 0 then
    items[#items + 1] = {'i', id, reason}
  end
end
if #items == 0 then return {0, false} end
local statuses, event = settle(pk, ARGV[1], ARGV[2], q, items, now_ms())
local n = 0
for i = 1, #items do
  if statuses[i] == 1 then
    redis.call('HSET', pk[1], 'v:' .. items[i][2], 1)
    n = n + 1
  end
end
if n > 0 then redis.call('HINCRBY', pk[1], 'voids', n) end
return {n, event or false}
