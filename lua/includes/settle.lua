-- @include signal
-- settle(pk, parent_id, parent_queue, pq, items, now): settle children of ONE parent, on the
-- parent's slot. Shared by complete (same-queue), fail (same-queue) and deliver (the Pump's
-- cross-queue half).
--   pk       = {row, dependencies, processed, unsuccessful, failed} keys of the parent
--   pq       = {pending, wake, outbox} keys of the parent's queue
--   items    = list of {kind, child_id, value}; kind 'c' | 'i' | 'f'
-- Each child is recorded with HSETNX: only a first record counts, so settling the same child
-- any number of times changes nothing beyond the first. 'c' and 'i' decrement the counter
-- (one DECRBY for the whole group) and release a held parent at 0; 'f' fails the parent.
-- A parent that fails and has a parent of its own emits a signal into its own queue's outbox,
-- kind chosen by ITS policy token, so failure climbs the tree one Pump hop per level.
-- Returns: statuses, event. statuses: one per item, 1 recorded now, 0 already recorded, -1 the
-- parent row does not exist (nothing written). event: 'r' the parent was released by this
-- call, 'f' it failed by this call, nil otherwise (the host fires lifecycle hooks from it).
local function settle(pk, parent_id, parent_queue, pq, items, now)
  local statuses = {}
  local state = redis.call('HGET', pk[1], 'state')
  if not state then
    for i = 1, #items do statuses[i] = -1 end
    return statuses, nil
  end
  local event = nil
  local settled = 0
  local first_failure = nil
  for i = 1, #items do
    local kind, child, value = items[i][1], items[i][2], items[i][3]
    local target = pk[3]
    if kind == 'i' then target = pk[4] elseif kind == 'f' then target = pk[5] end
    if redis.call('HSETNX', target, child, value) == 1 then
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
      redis.call('HSET', pk[1], 'state', 'pending')
      redis.call('ZADD', pq[1], 0, parent_id)
      redis.call('ZADD', pq[2], 0, 'w')
      state = 'pending'
      event = 'r'
    end
  end
  if first_failure and state == 'held' then
    local err = 'child ' .. first_failure[1] .. ' failed: ' .. first_failure[2]
    redis.call('HSET', pk[1], 'state', 'failed', 'error', err, 'finished', now)
    event = 'f'
    local up = redis.call('HMGET', pk[1], 'parent', 'parent_queue', 'parent_policy')
    if up[1] then
      local kind = 'f'
      if up[3] == 'id' then kind = 'i' end
      redis.call('RPUSH', pq[3], signal(kind, parent_id, up[2] or parent_queue, up[1], err))
    end
  end
  return statuses, event
end
