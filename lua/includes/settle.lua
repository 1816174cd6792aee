-- @include settle_current
-- settle(pk, parent_id, parent_queue, q, items, now): settle children of ONE parent, on the
-- parent's slot. Shared by complete (same-queue), fail (same-queue) and deliver (the Pump's
-- cross-queue half).
--   pk       = {row, dependencies, processed, unsuccessful, failed, explicit, log} keys of the
--              parent (log: the settle log, written only when the row has `log`)
--   q        = the parent queue's keys (queue_keys.lua)
--   items    = list of {kind, child_id, value}; kind 'c' | 'i' | 'f'
-- Reads the parent's row once; a missing row settles nothing. A replaced parent (generation
-- `gen` > 0) records only children of its current generation: derived ids
-- '<parent>.g<gen>.<i>', or ids in its explicit record; a late report of an older generation's
-- child changes nothing (status 0). The rest is settle_current.lua (which says what it writes
-- and who removes it).
-- Owner of what it writes: as settle_current.lua says (the flow's expiry, drop_node.lua).
-- Returns: statuses, event. statuses: one per item, 1 recorded now, 0 already recorded, -1 the
-- parent row does not exist (nothing written). event: 'r' the parent was released by this
-- call, 'f' it failed by this call, nil otherwise (the host fires lifecycle hooks from it).
-- A parent with a success threshold (the row's `allow`, written by hold.lua) tolerates that
-- many fail-parent deaths: see settle_current.lua. A node whose row has `voids` (unspawn.lua
-- uncounted ids that an earlier run of a spawner recorded and never landed) drops reports of
-- those ids (a row field 'v:<id>'; one HEXISTS per item, only in such a flow): a zombie run
-- that lands one later cannot count it twice.
local function settle(pk, parent_id, parent_queue, q, items, now)
  local statuses = {}
  local row = redis.call('HMGET', pk[1], 'state', 'barrier', 'parent', 'gen', 'repairs', 'allow',
    'log', 'voids')
  local state = row[1]
  if not state then
    for i = 1, #items do statuses[i] = -1 end
    return statuses, nil
  end
  if row[4] or row[8] then
    -- a replaced flow: drop reports of older generations' children; a flow with voided spawns
    -- (unspawn.lua: ids an earlier run of a spawner counted and never landed): drop theirs
    local prefix = row[4] and (parent_id .. '.g' .. row[4] .. '.')
    local current = {}
    for i = 1, #items do
      local child = items[i][2]
      local ok = true
      if prefix then
        ok = string.sub(child, 1, #prefix) == prefix or redis.call('HEXISTS', pk[6], child) == 1
      end
      if ok and row[8] then ok = redis.call('HEXISTS', pk[1], 'v:' .. child) == 0 end
      if ok then current[#current + 1] = items[i] end
    end
    if #current < #items then
      local kept = {}
      for _, item in ipairs(current) do kept[item] = true end
      local st, ev = settle_current(pk, parent_id, parent_queue, q, current, now, row)
      local out, j = {}, 1
      for i = 1, #items do
        if kept[items[i]] then out[i] = st[j]; j = j + 1 else out[i] = 0 end
      end
      return out, ev
    end
  end
  return settle_current(pk, parent_id, parent_queue, q, items, now, row)
end
