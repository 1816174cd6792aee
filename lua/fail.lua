-- fail: record a failed attempt for a batch of leased jobs of one queue; retry or bury each,
-- and apply the failure policy to the parents of the buried ones.
-- @include now_ms
-- @include settle_groups
-- @include batch
--
-- KEYS[1] active  KEYS[2] leases  KEYS[3] outbox  KEYS[4] pending
-- KEYS[5] delayed zset retries by due time       KEYS[6] dead    zset the morgue by time of death
-- KEYS[7] wake    zset set when a same-queue parent is released (idle workers block on it)
-- KEYS[8] flows:held  KEYS[9] flows:released  KEYS[10] flows:failed  this queue's flow indexes
-- KEYS[11] outbox:wake zset set with every signal pushed to the outbox (an idle Pump blocks on it)
-- KEYS[11+i]      the row of job i (i = 1..n)
-- KEYS[11+n+6(g-1)+1 .. +6]  parent group g (same-queue parents): row, dependencies, processed,
--                           unsuccessful, failed, explicit
-- ARGV[1] queue
-- ARGV[2..] the batch, as complete.lua takes it (see includes/batch.lua), each job's record 6
--   values: id, token number, error, traceback, delay_ms, ref
--   traceback: the attempt's traceback text (at most 16 KiB, cut by the host), '' when it has
--             none: kept on the row as the field 'traceback' (the last failed attempt's), and
--             removed from the row by an attempt that has none
--   delay_ms: the backoff before the next attempt, chosen by the host (exponential, jittered);
--             -1 buries the job now whatever its attempts (an unrecoverable error)
--   ref: 0 no parent; k > 0 a child of same-queue group k; -k a child of cross-queue parent k
--
-- Steps: tokens checked with one HMGET (batch.lua): a stale failure changes nothing. For each
-- current job: attempts + 1; below max_attempts (and delay_ms >= 0) it goes to delayed with its error;
-- otherwise it dies: state 'dead', into the morgue, and its parent is settled by the child's
-- policy token (read here from the row: 'id' ignores the dependency, anything else fails the
-- parent) - same-queue inside this script, cross-queue by a signal into this queue's outbox.
-- Owner of what it writes: retries in delayed are moved by promote (or a claim); dead entries
-- are dropped by the dead retention (expire.lua), a plain job's row with them, a flow child's
-- row with its flow; the row fields it sets (attempts, error, traceback, state) go with the
-- row; outbox signals are trimmed by the Pump, the outbox:wake member popped by an idle Pump;
-- records and counters of same-queue parents go with their flow.
-- Returns: {statuses, events}: statuses per job 0 (lease lost), 1 (retry scheduled), 2 (dead);
-- events as in complete.lua.
local queue = ARGV[1]
local b = batch(2, 6)
local n, cross, base = b.n, b.cross, b.base
if n == 0 then return {{}, {}} end
local now = now_ms()
local out, done, later, dead, signals, groups = {}, {}, {}, {}, {}, {}
for i = 1, n do
  local r = base + (i - 1) * 6
  local id, err, trace, delay, ref = ARGV[r + 1], ARGV[r + 3], ARGV[r + 4],
    tonumber(ARGV[r + 5]), tonumber(ARGV[r + 6])
  if not b.current[i] then
    out[i] = 0
  else
    done[#done + 1] = id
    local row = KEYS[11 + i]
    local meta = redis.call('HMGET', row, 'max_attempts', 'parent_policy', 'epoch')
    local attempts = redis.call('HINCRBY', row, 'attempts', 1)
    if trace == '' then
      redis.call('HDEL', row, 'traceback')
    else
      redis.call('HSET', row, 'traceback', trace)
    end
    if delay >= 0 and attempts < (tonumber(meta[1]) or 1) then
      out[i] = 1
      redis.call('HSET', row, 'error', err)
      later[#later + 1] = now + delay; later[#later + 1] = id
    else
      out[i] = 2
      redis.call('HSET', row, 'state', 'dead', 'error', err, 'finished', now)
      dead[#dead + 1] = now; dead[#dead + 1] = id
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
  redis.call('ZREM', KEYS[1], unpack(done))
  redis.call('HDEL', KEYS[2], unpack(done))
end
if #later > 0 then redis.call('ZADD', KEYS[5], unpack(later)) end
if #dead > 0 then redis.call('ZADD', KEYS[6], unpack(dead)) end
push_signals(KEYS[3], KEYS[11], signals)
local events = settle_groups(groups, 11 + n, b.ids_at, queue,
  {KEYS[4], KEYS[7], KEYS[3], KEYS[8], KEYS[9], KEYS[10], KEYS[11]}, now)
return {out, events}
