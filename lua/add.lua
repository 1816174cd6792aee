-- add: land a batch of plain jobs of one queue that share their options.
-- @include check_id
-- @include now_ms
--
-- KEYS[1]   pending    zset   claimable jobs
-- KEYS[2]   delayed    zset   jobs with a due time
-- KEYS[3]   seq        string this queue's arrival counter (FIFO without trusting clocks)
-- KEYS[4]   wake       zset   set when jobs become claimable (idle workers block on it)
-- KEYS[4+i] job row i  hash   one per job, in ARGV order
-- ARGV[1]   check         '1': skip ids whose row exists (a retry by id never re-queues);
--                         '0': the host generated fresh ids, skip the existence check
-- ARGV[2]   max_attempts  ARGV[3] delay_ms  ARGV[4] priority (0..800, lower runs first)
-- ARGV[5]   timeout_ms    the jobs' handler time limit ('' = the queue's)
-- then per job, 2 values: id, payload
--
-- Steps: refuse any bad id before writing anything; write each new row (one HSET) and collect
-- it; then ONE ZADD into pending (or delayed) for the batch. Pending scores are
-- priority * 2^40 + arrival number: FIFO within a priority (one INCRBY numbers the batch).
-- Score 0 is the front: recovered leases, promoted retries and released parents go there.
-- Owner of what it writes: a row is removed by its completion (keep_completed off) or by the
-- retention sweep of its end state.
-- Returns: the number of jobs added (ids that existed are left untouched).
-- Errors: EMQKIND a job id is malformed (nothing written).
local check, attempts = ARGV[1], ARGV[2]
local delay, priority = tonumber(ARGV[3]), tonumber(ARGV[4])
local n = (#ARGV - 5) / 2
local fields = {'payload', '', 'max_attempts', attempts}
if ARGV[5] ~= '' then fields[5] = 'timeout'; fields[6] = ARGV[5] end
for i = 1, n do
  local bad = check_id(ARGV[4 + 2 * i])
  if bad then return bad end
end
local due = 0
if delay > 0 then due = now_ms() + delay end
local seq = redis.call('INCRBY', KEYS[3], n) - n
local add = {}
for i = 1, n do
  local id, row = ARGV[4 + 2 * i], KEYS[4 + i]
  if check ~= '1' or redis.call('EXISTS', row) == 0 then
    fields[2] = ARGV[5 + 2 * i]
    redis.call('HSET', row, unpack(fields))
    if delay > 0 then
      add[#add + 1] = due
    else
      add[#add + 1] = priority * 1099511627776 + seq + i
    end
    add[#add + 1] = id
  end
end
if #add > 0 then
  local target = KEYS[1]
  if delay > 0 then target = KEYS[2] end
  redis.call('ZADD', target, unpack(add))
  if delay <= 0 then redis.call('ZADD', KEYS[4], 0, 'w') end
end
return #add / 2
