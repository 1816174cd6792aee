#!lua
-- add: land a batch of plain jobs of one queue that share their options.
-- @include check_id
-- @include now_ms
-- @include queue_keys
-- @include claimable
-- @include fair
--
-- KEYS[1..15] the queue's keys (includes/queue_keys.lua). Used here: pending and wake (jobs
--             claimable now), delayed (jobs with a due time), seq (the arrival counter: FIFO
--             without trusting clocks)
-- KEYS[15+i]  job row i  hash  one per job, in ARGV order
-- KEYS[16+n]  fair       hash  the queue's fairness tags (includes/fair.lua)
-- ARGV[1]   check         '1': skip ids whose row exists (a retry by id never re-queues);
--                         '0': the host generated fresh ids, skip the existence check
-- ARGV[2]   max_attempts  ARGV[3] delay_ms  ARGV[4] priority (0..800, lower runs first)
-- ARGV[5]   timeout_ms    the jobs' handler time limit ('' = the queue's)
-- ARGV[6]   stem          '' (each job's record carries its id) or the stem of ids the host
--                         generated: job i's id is then stem .. hex(start + i - 1)
-- ARGV[7]   start         with a stem: the first job's index (decimal); else ''
-- ARGV[8]   grouped       '1': each job's record ends with its fairness group ('' = none);
--                         '' : no record carries one
-- ARGV[7+2i] ARGV[8+2i]  job i (i = 1..n): its id, its payload - or, with a stem, ARGV[8+i]:
--                         its payload only; with ARGV[8] '1' its group follows (width 3 or 2)
--
-- Why a stem: checking an id is a Lua pattern over every character (about as much as the
-- row's HSET costs); a stem is checked once per call, and an id made of a checked stem and
-- hex digits the script formats itself cannot break the grammar - so a client that skips the
-- host still cannot write a bad id, whichever form it sends.
--
-- Steps: refuse any bad id (or stem) before writing anything; write each new row (one HSET of
-- payload, timeout when given, and `run`: max_attempts, attempts, stalls, timeout and created -
-- the server's ms, which the dashboard reads for the age of a queue's oldest pending job -
-- packed in one field, includes/run.lua) and collect it; then ONE ZADD into pending (or
-- delayed) for the batch. Pending scores are priority * 2^40 + arrival number: FIFO within a
-- priority (one INCRBY numbers the batch). A queue that has ever been given a job with a
-- group (its 'fair' hash exists) numbers by turns instead: includes/fair.lua gives the tags,
-- jobs without a group taking their turns as one group.
-- Score 0 is the front: recovered leases, promoted retries and released parents go there.
-- Full server: refused before it runs (no allow-oom): it may grow memory, so it writes all or
--  nothing.
-- Owner of what it writes: a row is removed by its completion (keep_completed off) or by the
-- retention sweep of its end state.
-- The 'fair' hash (grouped jobs, or a queue that has one): a group's 'g:' field is deleted by
-- the Pump's retention sweep once it is behind the claims (fair_prune.lua); 'max' lives as
-- long as the queue, as 'seq' does (includes/fair.lua). A row's 'group' field goes with the row.
-- Returns: the number of jobs added (ids that existed are left untouched).
-- Errors: EMQKIND a job id, the stem or the start is malformed (nothing written).
local q = queue_keys(KEYS)
local check, attempts = ARGV[1], ARGV[2]
local delay, priority = tonumber(ARGV[3]), tonumber(ARGV[4])
local stem, start = ARGV[6], nil
local grouped = ARGV[8] == '1'
local width, first = 2, 9  -- values per job record; where the first record starts
if stem ~= '' then
  width = 1
  start = tonumber(ARGV[7])
  -- an exact integer index, and every id it makes short enough (14 hex digits at most)
  if not start or start < 0 or start ~= math.floor(start) or start >= 2 ^ 52 then
    return redis.error_reply('EMQKIND the start of generated ids must be an integer >= 0: ' ..
      ARGV[7])
  end
  local bad = check_id(stem .. '0')
  if bad or #stem > 190 then
    return redis.error_reply('EMQKIND generated ids need a stem of JOB- plus a safe tail: ' ..
      stem)
  end
  start = start - 1
end
if grouped then width = width + 1 end
local n = (#ARGV - first + 1) / width
local fk = KEYS[16 + n]
local fields = {'payload', ''}
local limit = '-'
if ARGV[5] ~= '' then fields[3] = 'timeout'; fields[4] = ARGV[5]; limit = ARGV[5] end
if not start then
  for i = 1, n do
    local bad = check_id(ARGV[first + width * (i - 1)])
    if bad then return bad end
  end
end
local now = now_ms()
-- 'run': max_attempts and created, and what the claim reads of the row besides the payload,
-- in one field (includes/run.lua)
fields[#fields + 1] = 'run'; fields[#fields + 1] = attempts .. ' 0 0 ' .. limit .. ' ' .. now
local due = 0
if delay > 0 then due = now + delay end
-- the payload of job i is at ARGV[pay + width * (i - 1)], its group (grouped) right after it
local pay = first
if not start then pay = first + 1 end
local groups, tags = {}, nil
if grouped then
  for i = 1, n do
    groups[i] = ARGV[pay + width * (i - 1) + 1]
    if #groups[i] > 204 then
      return redis.error_reply('EMQKIND a group is at most 204 characters: ' .. groups[i])
    end
  end
end
if delay == 0 and (grouped or redis.call('EXISTS', fk) == 1) then
  if not grouped then for i = 1, n do groups[i] = '' end end
  tags = fair(fk, q.pending, q.seq, groups, n)
end
local seq = 0
if not tags then seq = redis.call('INCRBY', q.seq, n) - n end
local add, nf = {}, #fields
for i = 1, n do
  local id, row = nil, KEYS[15 + i]
  if start then
    id = stem .. string.format('%x', start + i)
  else
    id = ARGV[first + width * (i - 1)]
  end
  fields[2] = ARGV[pay + width * (i - 1)]
  if check ~= '1' or redis.call('EXISTS', row) == 0 then
    if grouped and groups[i] ~= '' then  -- the row names its group (reads, job.group)
      fields[nf + 1] = 'group'; fields[nf + 2] = groups[i]
    else
      fields[nf + 1] = nil; fields[nf + 2] = nil
    end
    redis.call('HSET', row, unpack(fields))
    if delay > 0 then
      add[#add + 1] = due
    elseif tags then
      add[#add + 1] = priority * 1099511627776 + tags[i]
    else
      add[#add + 1] = priority * 1099511627776 + seq + i
    end
    add[#add + 1] = id
  end
end
if delay > 0 then
  if #add > 0 then redis.call('ZADD', q.delayed, unpack(add)) end
else
  claimable(q.pending, q.wake, add)
end
return #add / 2
