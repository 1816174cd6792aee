#!lua
-- repair: put a failed or cancelled node of a flow back to work (step 1, on its slot): the
-- children to re-run are recorded, the node is held again with the right counter.
-- @include now_ms
-- @include flow_node
-- @include queue_keys
-- @include claimable
--
-- KEYS[1..15] the queue's keys (includes/queue_keys.lua). Used here: the five flows_* indexes
--             (a root leaves its index; held or released again), pending and wake (a parent
--             with nothing left outstanding is released at once)
-- KEYS[16] row  KEYS[17] dependencies  KEYS[18] processed  KEYS[19] unsuccessful
-- KEYS[20] failed  the node's keys
-- KEYS[21] repair    hash  child id -> kind ('f' | 'i'): the children this repair re-runs
-- KEYS[22] explicit  hash  the node's explicit-id record (child id -> queue)
-- ARGV[1] id  ARGV[2] ignored ('1': ignored failures are re-run too)  ARGV[3] its parent
--         ('' for a root)
--
-- Steps: a failed node moves its :failed records (and, with `ignored`, its :unsuccessful ones,
-- adding them back to the counter) into :repair, and becomes 'held' again - so a repaired child
-- that dies again is recorded afresh and fails it again. A cancelled node becomes 'held' and
-- is marked `rerun`: its cancelled children go back to work. A released barrier flow with
-- `ignored` re-runs its ignored failures the same way. A node with a repair in progress (held,
-- :repair not empty, or rerun) is left as it is: the host goes on where a cut repair stopped.
-- A threshold flow (settle_current.lua): its tolerated deaths go back on the counter, and a
-- tipped one (its unstarted children were cancelled) is marked `rerun` like a cancelled one;
-- dropping `tipped` makes a late 'x' signal of the old failure change nothing.
-- Completed children keep their values and never run again. If nothing is left outstanding,
-- the node is released at once (as a settle would). The host then puts the children listed
-- in :repair back to pending on their slots (requeue.lua) and clears :repair (repair_done.lua).
-- Full server: refused before it runs (no allow-oom): it may grow memory, so it writes all or
--  nothing.
-- Owner of what it writes: :repair is emptied by repair_done.lua (or goes with the flow).
-- Returns: {state after, total, child queues, {explicit id, queue, ...}, {ids to re-run},
--           rerun ('1' | ''), repairs, gen}.
-- Errors: EMQNOJOB no such node; EMQFLOW a plain job, a node that is not the root named, or a
-- flow with nothing to repair (closed, completed, run by a worker).
local q = queue_keys(KEYS)
local row, refused = flow_node(KEYS[16], ARGV[1], ARGV[3], 'repair',
  {'cq', 'barrier', 'rerun', 'gen', 'tolerated', 'tipped'})
if refused then return refused end
local state = row[1]
local root = ARGV[3] == ''
local ignored = ARGV[2] == '1'
local rerun = row[7] or ''
local function move(from, kind)
  local flat = redis.call('HGETALL', from)
  for i = 1, #flat, 2 do
    redis.call('HSET', KEYS[21], flat[i], kind)
    -- the child's next run reports with this epoch; a report of an older one is stale
    redis.call('HINCRBY', KEYS[16], 'e:' .. flat[i], 1)
  end
  redis.call('DEL', from)
  return #flat / 2
end
local flip = false
if state == 'failed' or state == 'cancelled' or (state == 'released' and ignored) then
  flip = true
elseif state == 'held' then
  if ignored and redis.call('HLEN', KEYS[19]) > 0 then flip = true end
elseif state ~= 'held' then
  return redis.error_reply('EMQFLOW flow ' .. ARGV[1] .. ' is ' .. state ..
    ': nothing to repair (repair re-runs the dead children of a failed or cancelled flow)')
end
local repairs = redis.call('HGET', KEYS[16], 'repairs') or '0'
if flip then
  move(KEYS[20], 'f')
  -- a threshold flow's tolerated deaths were counted as settled: they run again, so they count
  -- again; a tipped one had its unstarted children cancelled: those run again too
  if row[9] then redis.call('INCRBY', KEYS[17], row[9]) end
  if row[10] then rerun = '1' end
  if ignored then
    local n = move(KEYS[19], 'i')
    if n > 0 then redis.call('INCRBY', KEYS[17], n) end
  end
  if state == 'cancelled' then rerun = '1' end
  redis.call('HDEL', KEYS[16], 'error', 'finished', 'reason', 'cancelled', 'cancelled_from',
    'released', 'tolerated', 'tipped', 'stopped')
  redis.call('HSET', KEYS[16], 'state', 'held', 'rerun', rerun)
  repairs = tostring(redis.call('HINCRBY', KEYS[16], 'repairs', 1))
  for _, index in ipairs({q.flows_held, q.flows_released, q.flows_closed, q.flows_failed,
      q.flows_cancelled}) do
    redis.call('ZREM', index, ARGV[1])
  end
  state = 'held'
  local left = tonumber(redis.call('GET', KEYS[17]) or '0')
  if left <= 0 and redis.call('HLEN', KEYS[21]) == 0 and rerun == '' then
    -- nothing left to run: released now, as the last settle would have done
    local now = now_ms()
    if row[6] then
      redis.call('HSET', KEYS[16], 'state', 'released', 'released', now)
      if root then redis.call('ZADD', q.flows_released, now, ARGV[1]) end
      state = 'released'
    else
      redis.call('HSET', KEYS[16], 'state', 'pending')
      claimable(q.pending, q.wake, {0, ARGV[1]})
      state = 'pending'
    end
  elseif root then
    redis.call('ZADD', q.flows_held, now_ms(), ARGV[1])
  end
end
return {state, row[2], row[5] or '', redis.call('HGETALL', KEYS[22]),
  redis.call('HKEYS', KEYS[21]), rerun, repairs, row[8] or ''}
