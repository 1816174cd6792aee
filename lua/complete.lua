#!lua
-- complete: record the results of a batch of leased jobs of one queue, with the fan-in.
-- @include now_ms
-- @include queue_keys
-- @include settle_groups
-- @include batch
-- @include signal
-- @include push_signals
-- @include free_tokens
-- @include tally
--
-- KEYS[1..15] the queue's keys (includes/queue_keys.lua). Used here: active and leases (the
--             leases end), completed, and for the fan-in: pending and wake (a same-queue parent
--             released), outbox and outbox_wake (cross-queue signals), flows_held,
--             flows_released and flows_failed (a root moves between them)
-- KEYS[15+j]  the row of the j-th PLAIN job of the batch (j = 1..p): only plain jobs have a
--             row to write
-- KEYS[15+p+7(g-1)+1 .. +7]  parent group g: row, dependencies, processed, unsuccessful, failed,
--             explicit, log (same-queue parents only; the host read each job's parent when it
--             claimed it)
-- then 2 keys per gated ref of ARGV[3], in that order: the gate (waiting, cap) of that parent's
--             children in this queue (includes/gate.lua)
-- then        the queue's config (keyspace.config), only when ARGV[4] is not '': read for its
--             rate limit (includes/hand.lua)
-- then        flows_completed  zset  worker-run root flows whose parent job completed, by
--             finish time; only when ARGV[2] names root parents (KEYS[#KEYS - 1])
-- KEYS[#KEYS] the queue's minute tallies (keyspace.minutes, always the last key): the jobs
--             completed here are counted in this minute's field (includes/tally.lua), in this
--             script, so a batch and its count are written together or not at all
-- ARGV[1] queue     this queue's name (carried in signals)
-- ARGV[2] keep      '1': a finished plain job keeps its row with the result; '0': delete it
--                   (never a flow parent's row: see below); then, space-separated, the
--                   numbers j (as in KEYS[15+j]) of the plain jobs that are released root
--                   flow parents (the host read their state 'pending' when it claimed them):
--                   those enter flows_completed, so `flow ls` finds a finished worker-run flow
--                   without scanning `completed` (a batch without one pays nothing)
-- ARGV[3] gates     the refs (see below) whose children are gated by a max_running cap,
--                   space-separated ('' = none): the host read each child's gate mark with
--                   its row when it claimed it
-- ARGV[4] hand      '' or '<lease token> <lease_ms> <room>': the completing worker takes up to
--                   room children the gates admit here as its own leases (includes/hand.lua)
-- ARGV[5..] the batch (see includes/batch.lua), each job's record 4 values: id, token number,
--   result, ref ('0' plain job; k > 0 child of same-queue group k, settled here, atomically;
--   -k child of cross-queue parent k: a signal into this queue's outbox); 2 (id, result)
--   when the batch's header gives one shared ref
--
-- Steps: read all lease tokens with one HMGET; a job whose token is not current is skipped
-- untouched (a stale completion changes nothing). For the rest: one ZREM from active, one HDEL
-- of leases, one ZADD into completed, the same-queue fan-in per parent group (see settle), one
-- RPUSH of all cross-queue signals. A plain job's row gets its result (or is deleted when
-- keep is '0'); a flow child's row is not written at all: its result lives in the parent's
-- :processed (or in the signal on its way there), and membership of `completed` says it is
-- done - so a child costs one command here, its fan-in record. A kept row gets ONE field,
-- 'done' = '<length of the token>:<token><result>': the final attempt's lease token, which
-- names the claiming worker and the claim's time (workers_registry.read_token, with which the
-- dashboard reads it), and the result, in one value (models.split_done) - the prefix made
-- once per token of the batch, so a job costs one concatenation and two values fewer than
-- a field each. Returns: {statuses, events, handed}:
-- statuses per job 1 (completed) / 0 (lease lost); events a flat list of pairs
-- ('r' | 'f', parent id) for same-queue parents this call released or failed. A gated child
-- that completes returns its token: its gate admits the next waiting child in this step;
-- handed = the ids of admitted children leased to the caller (ARGV[4]), in admission order.
-- Full server: refused before it runs (no allow-oom): it may grow memory, so it writes all or
--  nothing.
-- Owner of what it writes: the completed entries are dropped by the queue's retention sweep
-- (expire.lua); a plain job's row goes with that entry, a flow child's and a parent's row with
-- their flow's expiry ('done' goes with the row); a root's flows_completed entry goes with its
-- flow, when the `completed` retention expires it (expire.lua) or a replace resets it
-- (reset.lua); :processed records and
-- counters go with the flow; outbox signals are trimmed by the Pump (trim_outbox.lua); the
-- wake member is popped by idle workers, the outbox:wake member by an idle Pump.
-- The gate's count and the children it admits: see includes/gate.lua (its keys go with the flow).
local q = queue_keys(KEYS)
local queue, keep = ARGV[1], string.sub(ARGV[2], 1, 1)
local roots = nil  -- plain job number -> true for released root parents (ARGV[2])
if #ARGV[2] > 1 then
  roots = {}
  for j in string.gmatch(string.sub(ARGV[2], 3), '%d+') do roots[tonumber(j)] = true end
end
local finished_roots = {}  -- score, id pairs for flows_completed
local b = batch(q.leases, ARGV, 5, 4)
local gated, freed = {}, {}
local refs = {}  -- the ref of each gate
for ref in string.gmatch(ARGV[3], '%S+') do
  gated[tonumber(ref)] = #freed + 1; freed[#freed + 1] = 0; refs[#freed] = tonumber(ref)
end
local n, cross, base = b.n, b.cross, b.base
if n == 0 then return {{}, {}, {}} end
local now = now_ms()
-- the finish time as a string once: a Lua number is formatted again for every argument
local stamp = string.format('%d', now)
local out, done, fin, signals, groups = {}, {}, {}, {}, {}
local p = 0  -- plain jobs so far: the next one's row is KEYS[15 + p]
local prefix = {}  -- token number -> '<length>:<token>', made once (see 'done' above)
for i = 1, n do
  local r = base + (i - 1) * b.width
  local id, t, result, ref = ARGV[r + 1], 1, ARGV[r + 2], b.shared
  if not ref then t, result, ref = tonumber(ARGV[r + 2]), ARGV[r + 3], tonumber(ARGV[r + 4]) end
  if ref == 0 then p = p + 1 end
  if not b.current[i] then
    out[i] = 0
  else
    out[i] = 1
    done[#done + 1] = id
    fin[#fin + 1] = stamp; fin[#fin + 1] = id
    local g = gated[ref]
    if g then freed[g] = freed[g] + 1 end
    if ref == 0 then
      -- a flow parent's row always stays (its counter and records live on beside it, and a
      -- retry by id of the finished flow must find it): the flow is swept as a unit
      local row = KEYS[15 + p]
      if keep == '1' or redis.call('HEXISTS', row, 'total') == 1 then
        local pre = prefix[t]
        if not pre then
          local token = ARGV[b.tokens + t]
          pre = #token .. ':' .. token
          prefix[t] = pre
        end
        redis.call('HSET', row, 'done', pre .. result)
      else
        redis.call('DEL', row)
      end
      if roots and roots[p] then
        finished_roots[#finished_roots + 1] = stamp; finished_roots[#finished_roots + 1] = id
      end
    elseif ref > 0 then
      local items = groups[ref]
      if not items then items = {}; groups[ref] = items end
      items[#items + 1] = {'c', id, result}
    else
      local k = cross + 2 * (-ref)
      signals[#signals + 1] = signal('c', id, ARGV[k], ARGV[k - 1], result)
    end
  end
end
if #done > 0 then
  redis.call('ZREM', q.active, unpack(done))
  redis.call('HDEL', q.leases, unpack(done))
  redis.call('ZADD', q.completed, unpack(fin))
end
if #finished_roots > 0 then redis.call('ZADD', KEYS[#KEYS - 1], unpack(finished_roots)) end
push_signals(q.outbox, q.outbox_wake, signals)
local events = settle_groups(groups, b.parents, KEYS, 15 + p, queue, q, now)
local at = 15 + p + 7 * #b.parents
local handed = free_tokens(q, KEYS, at, #b.parents, freed, refs, ARGV[4], now)
tally(KEYS[#KEYS], now, #done, 0, 0)
return {out, events, handed}
