-- @include signal
-- settle(pk, parent_id, parent_queue, pq, items, now): settle children of ONE parent, on the
-- parent's slot. Shared by complete (same-queue), fail (same-queue) and deliver (the Pump's
-- cross-queue half).
--   pk       = {row, dependencies, processed, unsuccessful, failed, explicit} keys of the parent
--   pq       = {pending, wake, outbox, flows:held, flows:released, flows:failed, outbox:wake}
--              keys of the parent's queue (the flow indexes: a root moves between them)
--   items    = list of {kind, child_id, value}; kind 'c' | 'i' | 'f'
-- Each child is recorded with HSETNX: only a first record counts, so settling the same child
-- any number of times changes nothing beyond the first. 'c' and 'i' decrement the counter
-- (one DECRBY for the whole group) and release a held parent at 0; 'f' fails the parent.
-- A parent that fails and has a parent of its own emits a signal into its own queue's outbox,
-- kind chosen by ITS policy token, so failure climbs the tree one Pump hop per level.
-- A released BARRIER root (a flow read from outside) is never made claimable: its state
-- becomes 'released' and it waits in flows:released for a reader to close it; any other
-- released parent goes to pending for a worker. A root leaves flows:held when it is released
-- or fails (then it enters flows:failed, where the failed retention finds it).
-- A cancelled parent is never released or failed: reports of children that finished before
-- the cancel (already on their way) are recorded and counted as usual, so a repair neither
-- re-runs them nor waits for them; running children lost their lease, so their reports never
-- get here. A replaced parent (generation `gen` > 0) records only children of
-- its current generation: derived ids '<parent>.g<gen>.<i>', or ids in its explicit record; a
-- late report of an older generation's child changes nothing (status 0).
-- Owner of what it writes: :processed/:unsuccessful/:failed records, the counter and the
-- row's fields go with the flow's expiry (expire.lua / forget.lua / drop.lua); flows:* entries
-- move on with the flow's state and are dropped at expiry; a released worker-run parent's
-- pending entry is claimed; the upward signal is trimmed by the Pump, and the outbox:wake member
-- set with it is popped by an idle Pump.
-- Returns: statuses, event. statuses: one per item, 1 recorded now, 0 already recorded, -1 the
-- parent row does not exist (nothing written). event: 'r' the parent was released by this
-- call, 'f' it failed by this call, nil otherwise (the host fires lifecycle hooks from it).
-- settle_current: settle items of the current flow (row = the parent row fields read
-- by settle: state, barrier, parent, gen, repairs). A death report ('i', 'f') of a repaired
-- flow's child carries the child's repair epoch (see death() in signal.lua): one older than
-- the epoch the parent gave that child at its last repair is stale (a redelivery of a report
-- from before the repair) and changes nothing.
local function settle_current(pk, parent_id, parent_queue, pq, items, now, row)
  local statuses = {}
  local state, barrier, root = row[1], row[2], not row[3]
  local event = nil
  local settled = 0
  local first_failure = nil
  for i = 1, #items do
    local kind, child, value = items[i][1], items[i][2], items[i][3]
    local target = pk[3]
    local stale = false
    if kind ~= 'c' then
      target = pk[5]
      if kind == 'i' then target = pk[4] end
      local epoch = 0
      if string.byte(value, 1) == 1 then
        local e, rest = string.match(value, '^\1(%d+)\1(.*)$')
        if e then epoch, value = tonumber(e), rest end
      end
      if row[5] then  -- a repaired flow: a death reported for a run before the last repair
        local current = tonumber(redis.call('HGET', pk[1], 'e:' .. child) or '0')
        stale = epoch < current
      end
    end
    if stale then
      statuses[i] = 0
    elseif redis.call('HSETNX', target, child, value) == 1 then
      statuses[i] = 1
      if kind == 'f' then
        if not first_failure then first_failure = {child, value} end
      else
        settled = settled + 1
      end
    else
      statuses[i] = 0
    end
  end
  if settled > 0 then
    local left = redis.call('DECRBY', pk[2], settled)
    if left <= 0 and state == 'held' and not first_failure then
      if barrier then
        redis.call('HSET', pk[1], 'state', 'released', 'released', now)
        redis.call('ZADD', pq[5], now, parent_id)
        state = 'released'
      else
        redis.call('HSET', pk[1], 'state', 'pending')
        redis.call('ZADD', pq[1], 0, parent_id)
        redis.call('ZADD', pq[2], 0, 'w')
        state = 'pending'
      end
      if root then redis.call('ZREM', pq[4], parent_id) end
      event = 'r'
    end
  end
  if first_failure and state == 'held' then
    local err = 'child ' .. first_failure[1] .. ' failed: ' .. first_failure[2]
    redis.call('HSET', pk[1], 'state', 'failed', 'error', err, 'finished', now)
    if root then
      redis.call('ZREM', pq[4], parent_id)
      redis.call('ZADD', pq[6], now, parent_id)
    end
    event = 'f'
    local up = redis.call('HMGET', pk[1], 'parent', 'parent_queue', 'parent_policy')
    if up[1] then
      local kind = 'f'
      if up[3] == 'id' then kind = 'i' end
      push_signals(pq[3], pq[7], {signal(kind, parent_id, up[2] or parent_queue, up[1], err)})
    end
  end
  return statuses, event
end

local function settle(pk, parent_id, parent_queue, pq, items, now)
  local statuses = {}
  local row = redis.call('HMGET', pk[1], 'state', 'barrier', 'parent', 'gen', 'repairs')
  local state = row[1]
  if not state then
    for i = 1, #items do statuses[i] = -1 end
    return statuses, nil
  end
  if row[4] then  -- a replaced flow: drop reports of older generations' children
    local prefix = parent_id .. '.g' .. row[4] .. '.'
    local current = {}
    for i = 1, #items do
      local child = items[i][2]
      if string.sub(child, 1, #prefix) == prefix or redis.call('HEXISTS', pk[6], child) == 1 then
        current[#current + 1] = items[i]
      end
    end
    if #current < #items then
      local kept = {}
      for _, item in ipairs(current) do kept[item] = true end
      local st, ev = settle_current(pk, parent_id, parent_queue, pq, current, now, row)
      local out, j = {}, 1
      for i = 1, #items do
        if kept[items[i]] then out[i] = st[j]; j = j + 1 else out[i] = 0 end
      end
      return out, ev
    end
  end
  return settle_current(pk, parent_id, parent_queue, pq, items, now, row)
end
