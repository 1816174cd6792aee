-- add: land a batch of plain jobs in one queue, claimable at once or at a due time.
-- @include check_id
-- @include now_ms
--
-- KEYS[1]   pending    zset   claimable jobs
-- KEYS[2]   delayed    zset   jobs with a due time
-- KEYS[3]   seq        string this queue's arrival counter (FIFO without trusting clocks)
-- KEYS[3+i] job row i  hash   one per job, in ARGV order
-- ARGV[1]   check      '1': skip ids whose row exists (a retry by id never re-queues);
--                      '0': the host generated fresh ids, skip the existence check
-- ARGV[2]   n          number of jobs
-- then per job, 5 values: id, payload, max_attempts, delay_ms, priority
--
-- Steps: refuse any bad id before writing anything; for each job (unless it exists) write
-- its row and collect it; then ONE ZADD into pending and one into delayed for the batch.
-- Pending scores are priority * 2^40 + arrival number: lower runs first, FIFO within a
-- priority (one INCRBY numbers the whole batch). Score 0 is the front: recovered leases,
-- promoted retries and released parents go there.
-- Returns: a list of 1 (added) / 0 (existed), one per job.
-- Errors: EMQKIND a job id is malformed (nothing written).
local check, n = ARGV[1], tonumber(ARGV[2])
for i = 0, n - 1 do
  local bad = check_id(ARGV[3 + i * 5])
  if bad then return bad end
end
local now = now_ms()
local seq = redis.call('INCRBY', KEYS[3], n) - n
local out, ready, later = {}, {}, {}
for i = 0, n - 1 do
  local b = 3 + i * 5
  local id, row = ARGV[b], KEYS[4 + i]
  if check == '1' and redis.call('EXISTS', row) == 1 then
    out[i + 1] = 0
  else
    redis.call('HSET', row, 'payload', ARGV[b + 1], 'max_attempts', ARGV[b + 2])
    local delay = tonumber(ARGV[b + 3])
    if delay > 0 then
      later[#later + 1] = now + delay
      later[#later + 1] = id
    else
      ready[#ready + 1] = tonumber(ARGV[b + 4]) * 1099511627776 + seq + i + 1
      ready[#ready + 1] = id
    end
    out[i + 1] = 1
  end
end
if #ready > 0 then redis.call('ZADD', KEYS[1], unpack(ready)) end
if #later > 0 then redis.call('ZADD', KEYS[2], unpack(later)) end
return out
