-- @include signal
-- @include push_signals
-- @include claimable
-- @include threshold_error
-- @include park
-- settle_current(pk, parent_id, parent_queue, q, items, now, row): settle items of ONE parent's
-- current flow, on the parent's slot (settle.lua has dropped other generations' reports).
--   pk    = {row, dependencies, processed, unsuccessful, failed, explicit, log} keys of the parent
--   q     = the parent queue's keys (queue_keys.lua): pending + wake (a released worker-run
--           parent), outbox + outbox_wake (a failed parent's signal upward), flows_held,
--           flows_released, flows_failed (a root moves between them)
--   items = list of {kind, child_id, value}; kind 'c' | 'i' | 'f'
--   row   = the parent row's fields settle read: state, barrier, parent, gen, repairs, allow, log
-- The settle log (row field `log` = '1', set by hold.lua for a flow added with stream=True):
-- every child recorded now (status 1) appends one entry, field = its kind, value = its id (an
-- id under the parent's, '<parent>.<rest>', kept as '.<rest>': most of an entry is the id), to
-- pk[7] in this same step, in settle order - so the log and the counter never disagree (a
-- redelivered or stale report records nothing and logs nothing). Values stay in :processed;
-- the reader (log_read.lua) fetches them, so an entry costs the same whatever the result's
-- size. A flow without `log` pays one HMGET field here and nothing else.
-- Each child is recorded set-if-absent: only a first record counts, so settling the same child
-- any number of times changes nothing beyond the first. Completions ('c', most of every settle)
-- are recorded in bulk: ONE HMGET of :processed for all of them tells which are recorded
-- already, and ONE HSET (slices of ROOM_SLICE: unpack's bound) writes the first records, right
-- after the loop and before anything reads :processed again; a child given twice in the items
-- counts once, as it did one by one. A `redis.call` per child (an HSETNX each) cost about 5,500
-- instructions before its arguments, the bulk pair about 650 per value (bench/cpu_per_job.md).
-- A lone completion and the deaths ('i', 'f': rare, each with its epoch check) keep their
-- HSETNX. A bulk of more than ROOMY completions of a flow of more than ROOMY_FLOW children
-- first makes :processed a hashtable (the '~roomy' field, as claim.lua does for leases; deleted
-- again in this step, and '~' never starts a job id): in a listpack (up to
-- hash-max-listpack-entries fields, 512 by default) every field read or written scans the
-- whole list, which made each of a big flow's first 512 records cost tens of thousands of
-- instructions. A flow of more than 512 children ends a hashtable anyway; one of 129 to 512
-- holds its records in about 75 bytes each instead of 45; a smaller flow keeps its listpack.
-- 'c' and 'i' decrement the counter (one DECRBY for the whole group) and release a held parent
-- at 0; 'f' fails the parent.
-- A parent that fails and has a parent of its own emits a signal into its own queue's outbox,
-- kind chosen by ITS policy token, so failure climbs the tree one Pump hop per level.
-- A released BARRIER root (a flow read from outside) is never made claimable: its state
-- becomes 'released' and it waits in flows:released for a reader to close it; any other
-- released parent goes to pending for a worker. A root leaves flows:held when it is released
-- or fails (then it enters flows:failed, where the failed retention finds it).
-- A cancelled parent is never released or failed: reports of children that finished before
-- the cancel (already on their way) are recorded and counted as usual, so a repair neither
-- re-runs them nor waits for them; running children lost their lease, so their reports never
-- get here. A death report ('i', 'f') of a repaired flow's child carries the child's repair
-- epoch (see death.lua): one older than the epoch the parent gave that child at its last
-- repair is stale (a redelivery of a report from before the repair) and changes nothing.
-- A success threshold (row field `allow` = N - required, set by hold.lua): a fail-parent death
-- ('f') of a held parent is recorded in :failed as usual; while |:failed| <= allow it is
-- TOLERATED: counted as settled like an ignored failure (the same DECRBY, release at 0) and
-- added to the row's `tolerated` count (repair.lua adds those back to the counter). So for any
-- flow, while its parent has not failed, :processed, :unsuccessful and :failed are disjoint and
-- |:processed| + |:unsuccessful| + |:failed| + dependencies = N (:failed is empty in a flow
-- without a threshold). The death that makes |:failed| exceed `allow` fails the parent at
-- once (the error names the count, the allowance and some of the failures) and marks the row
-- `tipped` = now. In that same step its children on this slot (those in the parent's queue)
-- that are pending or retrying are parked, out of reach of every claim (park.lua): at most
-- PARK_AT_TIP of them, so the step stays bounded (a flow of more children: the window of
-- derived ids from the tipping child's index on, where FIFO claims are about to go; the
-- host's follow-up parks the rest), and only derived ids of a flow without explicit ids (the
-- ids surely its own; a flow with explicit ids is parked by the follow-up, which reads them).
-- A signal 'x' (child id = parent id, value = that mark) goes into the parent queue's
-- outbox: its drainer parks the flow's children in its other queues, cancels every child that
-- has not started (lifecycle.stop_unstarted; the Pump that delivered the death runs it at
-- once too) and marks the row `stopped` = the same value, so a redelivered 'x' changes
-- nothing.
-- Owner of what it writes: :processed/:unsuccessful/:failed records, the settle log, the
-- counter and the row's fields go with the flow's expiry (expire.lua / drop.lua through
-- drop_node.lua; reset.lua for a replaced flow); flows:* entries
-- move on with the flow's state and are dropped at expiry; a released worker-run parent's
-- pending entry is claimed (its wake member popped by idle workers); the upward signal is
-- trimmed by the Pump, and the outbox:wake member set with it is popped by an idle Pump.
-- Returns: statuses, event, as settle.lua.
local PARK_AT_TIP = 5000  -- ids parked in the tipping step (park.lua: two ZMSCOREs per 1,000)
local ROOMY = 32  -- completions in one settle above which :processed is made a hashtable first,
local ROOMY_FLOW = 128  -- when the flow has more children than this (see above)
local ROOM = string.rep('-', 65)  -- longer than hash-max-listpack-value (64): see above
local ROOM_SLICE = 1000  -- fields per HMGET / HSET (unpack is bounded by the Lua stack)

local function settle_current(pk, parent_id, parent_queue, q, items, now, row)
  local statuses = {}
  local state, barrier, root = row[1], row[2], not row[3]
  local event = nil
  local settled = 0
  local first_failure = nil
  local allow = tonumber(row[6])  -- nil: no success threshold
  local failures, tolerated = nil, 0
  -- the completions' records: which exist already (one HMGET), the first ones to write (fresh)
  local done, had, fresh = {}, {}, {}
  for i = 1, #items do
    if items[i][1] == 'c' then done[#done + 1] = items[i][2] end
  end
  local bulk = #done > 1  -- a lone completion: its HSETNX is one call, the bulk pair two
  if not bulk then done = {} end
  -- a big bulk of a big flow: its :processed made a hashtable now (see above)
  local roomy = #done > ROOMY and (tonumber(redis.call('HGET', pk[1], 'total')) or 0) > ROOMY_FLOW
  if roomy then redis.call('HSET', pk[3], '~roomy', ROOM) end
  for j = 1, #done, ROOM_SLICE do
    local last = math.min(j + ROOM_SLICE - 1, #done)
    local got = redis.call('HMGET', pk[3], unpack(done, j, last))
    for k = 1, last - j + 1 do
      if got[k] then had[done[j + k - 1]] = true end
    end
  end
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
    local first = false
    if stale then
      first = false
    elseif kind == 'c' and bulk then
      first = not had[child]
      if first then
        had[child] = true
        fresh[#fresh + 1] = child; fresh[#fresh + 1] = value
      end
    else
      first = redis.call('HSETNX', target, child, value) == 1
    end
    if first then
      statuses[i] = 1
      if row[7] then
        local logged = child
        if string.sub(child, 1, #parent_id + 1) == parent_id .. '.' then
          logged = string.sub(child, #parent_id + 1)
        end
        redis.call('XADD', pk[7], '*', kind, logged)
      end
      if kind ~= 'f' then
        settled = settled + 1
      elseif allow and state == 'held' and not first_failure then
        failures = (failures and failures + 1) or redis.call('HLEN', pk[5])
        if failures <= allow then
          settled, tolerated = settled + 1, tolerated + 1
        else
          first_failure = {child, value}
        end
      elseif not first_failure then
        first_failure = {child, value}
      end
    else
      statuses[i] = 0
    end
  end
  for j = 1, #fresh, 2 * ROOM_SLICE do
    redis.call('HSET', pk[3], unpack(fresh, j, math.min(j + 2 * ROOM_SLICE - 1, #fresh)))
  end
  if roomy then redis.call('HDEL', pk[3], '~roomy') end
  if tolerated > 0 then redis.call('HINCRBY', pk[1], 'tolerated', tolerated) end
  if settled > 0 then
    local left = redis.call('DECRBY', pk[2], settled)
    if left <= 0 and state == 'held' and not first_failure then
      if barrier then
        redis.call('HSET', pk[1], 'state', 'released', 'released', now)
        redis.call('ZADD', q.flows_released, now, parent_id)
        state = 'released'
      else
        redis.call('HSET', pk[1], 'state', 'pending')
        claimable(q.pending, q.wake, {0, parent_id})
        state = 'pending'
      end
      if root then redis.call('ZREM', q.flows_held, parent_id) end
      event = 'r'
    end
  end
  if first_failure and state == 'held' then
    local err = 'child ' .. first_failure[1] .. ' failed: ' .. first_failure[2]
    if failures then
      err = threshold_error(pk[5], failures, allow, first_failure[1]) .. '; ' .. err
      redis.call('HSET', pk[1], 'tipped', now)
      -- the children in this queue stop now (see above)
      local info = redis.call('HMGET', pk[1], 'total', 'cq')
      local here = false
      for name in string.gmatch(info[2] or '', '%S+') do
        if name == parent_queue then here = true end
      end
      if here and redis.call('HLEN', pk[6]) == 0 then
        local total, stem, from = tonumber(info[1]) or 0, parent_id .. '.', 0
        if row[4] then stem = parent_id .. '.g' .. row[4] .. '.' end
        local tipper = first_failure[1]
        if total > PARK_AT_TIP and string.sub(tipper, 1, #stem) == stem then
          local i = tonumber(string.match(string.sub(tipper, #stem + 1), '^%d+$') or '0')
          from = math.max(0, math.min(i, total - PARK_AT_TIP))
        end
        park(q, stem, from, math.min(total, from + PARK_AT_TIP), {}, nil)
      end
      push_signals(q.outbox, q.outbox_wake, {signal('x', parent_id, parent_queue, parent_id, now)})
    end
    redis.call('HSET', pk[1], 'state', 'failed', 'error', err, 'finished', now)
    if root then
      redis.call('ZREM', q.flows_held, parent_id)
      redis.call('ZADD', q.flows_failed, now, parent_id)
    end
    event = 'f'
    local up = redis.call('HMGET', pk[1], 'parent', 'parent_queue', 'parent_policy')
    if up[1] then
      local kind = 'f'
      if up[3] == 'id' then kind = 'i' end
      push_signals(q.outbox, q.outbox_wake,
        {signal(kind, parent_id, up[2] or parent_queue, up[1], err)})
    end
  end
  return statuses, event
end
