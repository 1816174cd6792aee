-- complete: record the results of a batch of leased jobs of one queue, with the fan-in.
-- @include now_ms
-- @include settle_groups
--
-- KEYS[1] active    zset  leased jobs         KEYS[4] outbox   list  this queue's flow:outbox
-- KEYS[2] leases    hash  id -> token         KEYS[5] pending  zset  this queue's pending
-- KEYS[3] completed zset  finished jobs by finish time (ms)
-- KEYS[6] wake      zset  set when a same-queue parent is released (idle workers block on it)
-- KEYS[6+i]         the row of job i (i = 1..n)
-- KEYS[6+n+5(g-1)+1 .. +5]  parent group g: row, dependencies, processed, unsuccessful, failed
--                   (same-queue parents only; the host read each job's parent when it claimed it)
-- ARGV[1] queue     this queue's name (carried in signals)
-- ARGV[2] keep      '1': a finished plain job keeps its row with the result; '0': delete it
-- ARGV[3] n         ARGV[4] g: number of jobs, of parent groups
-- ARGV[5 .. 4+g]    the parent id of each group
-- then per job, 6 values: id, token, result, mode, ref, parent_queue
--   mode ''  plain job;  's' child of parent group `ref` (same queue, settled here, atomically);
--        'x' child of parent `ref` in queue `parent_queue` (a signal into this queue's outbox)
--
-- Steps: read all lease tokens with one HMGET; a job whose token is not current is skipped
-- untouched (a stale completion changes nothing). For the rest: one ZREM from active, one HDEL
-- of leases, one ZADD into completed, the same-queue fan-in per parent group (see settle), one
-- RPUSH of all cross-queue signals. A plain job's row gets its result (or is deleted when
-- keep is '0'); a flow child's row is not written at all: its result lives in the parent's
-- :processed (or in the signal on its way there), and membership of `completed` says it is
-- done - so a child costs one command here, its fan-in record. Returns: {statuses, events}: statuses per job 1 (completed) /
-- 0 (lease lost); events a flat list of pairs ('r' | 'f', parent id) for same-queue parents
-- this call released or failed.
local queue, keep = ARGV[1], ARGV[2]
local n, g = tonumber(ARGV[3]), tonumber(ARGV[4])
local base = 4 + g
local ids = {}
for i = 1, n do ids[i] = ARGV[base + (i - 1) * 6 + 1] end
if n == 0 then return {{}, {}} end
local current = redis.call('HMGET', KEYS[2], unpack(ids))
local now = now_ms()
local out, done, fin, signals, groups = {}, {}, {}, {}, {}
for i = 1, n do
  local b = base + (i - 1) * 6
  local id, token, result, mode = ARGV[b + 1], ARGV[b + 2], ARGV[b + 3], ARGV[b + 4]
  if current[i] ~= token then
    out[i] = 0
  else
    out[i] = 1
    done[#done + 1] = id
    fin[#fin + 1] = now; fin[#fin + 1] = id
    if mode == '' then
      if keep == '1' then
        redis.call('HSET', KEYS[6 + i], 'result', result)
      else
        redis.call('DEL', KEYS[6 + i])
      end
    else
      if mode == 's' then
        local gi = tonumber(ARGV[b + 5])
        groups[gi] = groups[gi] or {}
        table.insert(groups[gi], {'c', id, result})
      else
        signals[#signals + 1] = signal('c', id, ARGV[b + 6], ARGV[b + 5], result)
      end
    end
  end
end
if #done > 0 then
  redis.call('ZREM', KEYS[1], unpack(done))
  redis.call('HDEL', KEYS[2], unpack(done))
  redis.call('ZADD', KEYS[3], unpack(fin))
end
if #signals > 0 then redis.call('RPUSH', KEYS[4], unpack(signals)) end
local events = settle_groups(groups, 6 + n, 4, queue, {KEYS[5], KEYS[6], KEYS[4]}, now)
return {out, events}
