#!lua
-- fail: record a failed attempt for a batch of leased jobs of one queue; retry or bury each,
-- and apply the failure policy to the parents of the buried ones.
-- @include now_ms
-- @include queue_keys
-- @include settle_groups
-- @include batch
-- @include signal
-- @include push_signals
-- @include death
-- @include free_tokens
-- @include holder
-- @include attempt
-- @include run
-- @include tally
--
-- KEYS[1..15] the queue's keys (includes/queue_keys.lua). Used here: active and leases (the
--             leases end), delayed (retries by due time), dead (the morgue by time of death),
--             and for the fan-in: pending and wake (a same-queue parent released), outbox and
--             outbox_wake (cross-queue signals), flows_held, flows_released and flows_failed
-- KEYS[15+i]  the row of job i (i = 1..n)
-- KEYS[15+n+7(g-1)+1 .. +7]  parent group g (same-queue parents): row, dependencies, processed,
--             unsuccessful, failed, explicit, log
-- then 2 keys per gated ref of ARGV[2], in that order: the gate (waiting, cap) of that parent's
--             children in this queue (includes/gate.lua)
-- then        the queue's config, only when ARGV[3] is not '' (as in complete.lua)
-- KEYS[#KEYS] the queue's minute tallies (as in complete.lua): the attempts failed here and
--             the deaths among them are counted in this minute's field (includes/tally.lua)
-- ARGV[1] queue
-- ARGV[2] gates  the refs whose children are gated by a max_running cap, space-separated
--   ('' = none), as complete.lua takes them
-- ARGV[3] hand   the hand-off of the children admitted here, as complete.lua's ARGV[4]
-- ARGV[4..] the batch, as complete.lua takes it (see includes/batch.lua), each job's record 6
--   values: id, token number, error, traceback, delay_ms, ref; 4 (id, error, traceback,
--   delay_ms) when the batch's header gives one shared ref
--   traceback: the attempt's traceback text (at most 16 KiB, cut by the host), '' when it has
--             none: kept on the row as the field 'traceback' (the last failed attempt's), and
--             removed from the row by an attempt that has none
--   delay_ms: the backoff before the next attempt, chosen by the host (exponential, jittered);
--             -1 buries the job now whatever its attempts (an unrecoverable error)
--   ref: 0 no parent; k > 0 a child of same-queue group k; -k a child of cross-queue parent k
--
-- Steps: tokens checked with one HMGET (batch.lua): a stale failure changes nothing. For each
-- current job: attempts + 1, the attempt appended to the row's 'history' (includes/attempt.lua:
-- when it started and on which worker, read from its lease token; when it ended; its outcome
-- and first error line; the last 10 kept, at most 1.6 KiB, in the HMGET and HSET this script
-- makes anyway); below max_attempts (and delay_ms >= 0) it goes to delayed with its error;
-- otherwise it dies: state 'dead', into the morgue, and its parent is settled by the child's
-- policy token (read here from the row: 'id' ignores the dependency, anything else fails the
-- parent) - same-queue inside this script, cross-queue by a signal into this queue's outbox.
-- A gated child that dies returns its token (its gate admits the next waiting child here); one
-- that goes to delayed keeps it (it is still the flow's to run).
-- Full server: refused before it runs (no allow-oom): it may grow memory, so it writes all or
--  nothing.
-- Owner of what it writes: retries in delayed are moved by promote (or a claim); dead entries
-- are dropped by the dead retention (expire.lua), a plain job's row with them, a flow child's
-- row with its flow; the row fields it sets (attempts and its copy in 'run', error, traceback,
-- state) go with the row ('history' too: kept across retries and repairs, bounded at 10
-- records); outbox signals are trimmed by the Pump, the outbox:wake member popped by an idle
-- Pump;
-- records and counters of same-queue parents go with their flow.
-- The gate's count and the children it admits: see includes/gate.lua (its keys go with the flow).
-- Returns: {statuses, events, handed}: statuses per job 0 (lease lost), 1 (retry scheduled),
-- 2 (dead); events and handed as in complete.lua.
local q = queue_keys(KEYS)
local queue = ARGV[1]
local b = batch(q.leases, ARGV, 4, 6)
local gated, freed = {}, {}
local refs = {}  -- the ref of each gate
for ref in string.gmatch(ARGV[2], '%S+') do
  gated[tonumber(ref)] = #freed + 1; freed[#freed + 1] = 0; refs[#freed] = tonumber(ref)
end
local n, cross, base = b.n, b.cross, b.base
if n == 0 then return {{}, {}, {}} end
local now = now_ms()
local out, done, later, dead, signals, groups = {}, {}, {}, {}, {}, {}
for i = 1, n do
  local r = base + (i - 1) * b.width
  local id, t, v, ref = ARGV[r + 1], 1, r + 2, b.shared  -- v: where its values start
  if not ref then t, v, ref = tonumber(ARGV[r + 2]), r + 3, tonumber(ARGV[r + 6]) end
  local err, trace, delay = ARGV[v], ARGV[v + 1], tonumber(ARGV[v + 2])
  if not b.current[i] then
    out[i] = 0
  else
    done[#done + 1] = id
    local row = KEYS[15 + i]
    local meta = redis.call('HMGET', row, 'max_attempts', 'parent_policy', 'epoch', 'history',
      'run')
    local token = ARGV[b.tokens + t]
    local attempts = redis.call('HINCRBY', row, 'attempts', 1)
    if trace == '' then
      redis.call('HDEL', row, 'traceback')
    else
      redis.call('HSET', row, 'traceback', trace)
    end
    -- the claim's packed copy follows the count (none when the row is gone)
    local packed = run(meta[5], attempts, nil)
    local extra = {}
    if packed then extra = {'run', packed} end
    -- max_attempts: its own field (a flow parent's) or run's first word
    local cap = tonumber(meta[1]) or tonumber(string.match(meta[5] or '', '^%d+')) or 1
    if delay >= 0 and attempts < cap then
      out[i] = 1
      redis.call('HSET', row, 'error', err, 'history', attempt(meta[4], token, now, 'r', err),
        unpack(extra))
      later[#later + 1] = now + delay; later[#later + 1] = id
    else
      out[i] = 2
      redis.call('HSET', row, 'state', 'dead', 'error', err, 'finished', now,
        'history', attempt(meta[4], token, now, 'd', err), unpack(extra))
      dead[#dead + 1] = now; dead[#dead + 1] = id
      local g = gated[ref]
      if g then freed[g] = freed[g] + 1 end
      local kind = 'f'
      if meta[2] == 'id' then kind = 'i' end
      local value = death(meta[3], err)
      if ref > 0 then
        groups[ref] = groups[ref] or {}
        table.insert(groups[ref], {kind, id, value})
      elseif ref < 0 then
        local k = cross + 2 * (-ref)
        signals[#signals + 1] = signal(kind, id, ARGV[k], ARGV[k - 1], value)
      end
    end
  end
end
if #done > 0 then
  redis.call('ZREM', q.active, unpack(done))
  redis.call('HDEL', q.leases, unpack(done))
end
if #later > 0 then redis.call('ZADD', q.delayed, unpack(later)) end
if #dead > 0 then redis.call('ZADD', q.dead, unpack(dead)) end
push_signals(q.outbox, q.outbox_wake, signals)
local events = settle_groups(groups, b.parents, KEYS, 15 + n, queue, q, now)
local at = 15 + n + 7 * #b.parents
local handed = free_tokens(q, KEYS, at, #b.parents, freed, refs, ARGV[3], now)
tally(KEYS[#KEYS], now, 0, #done, #dead / 2)
return {out, events, handed}
