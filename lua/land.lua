#!lua
-- land: land a batch of a flow's leaf children on their own queue's slot, claimable at once.
-- @include check_id
-- @include now_ms
-- @include queue_keys
-- @include claimable
-- @include gate
-- @include fair
--
-- KEYS[1..15] the queue's keys (includes/queue_keys.lua). Used here: pending and wake (the
--             children are claimable at once), seq (the arrival counter, see add.lua)
-- KEYS[15+i]  the row of child i (i = 1..n)
-- KEYS[15+n+1] fair  hash  the queue's fairness tags (includes/fair.lua)
-- KEYS[15+n+2] KEYS[15+n+3]  only with a share (ARGV[8]): the gate of this parent's children in
--             this queue (includes/gate.lua): waiting zset, cap hash
-- ARGV[1]   check     '1': skip children whose row exists; '0': their parent was held fresh by
--                     this very add and their ids derive from it, so no row of THIS parent can
--                     exist yet: one EXISTS over the batch stands for the per-child reads
--                     (a retry always reads each row)
-- ARGV[2]   parent id  the parent every child of this batch settles into
-- ARGV[3]   parent_queue  '' = the parent is in this queue (the same-queue fan-in); else the
--                     parent's queue (the outbox path)
-- ARGV[4]   policy    'fp' | 'id': the children's failure-policy token
-- ARGV[5]   max_attempts
-- ARGV[6]   timeout_ms  the children's handler time limit ('' = the queue's)
-- ARGV[7]   priority  0..800, lower runs first: pending scores are priority * 2^40 + arrival
--                     number, as add.lua's
-- ARGV[8]   share     '' = no cap; else this queue's share of the parent's max_running: the
--                     children enter the gate and at most `share` of them hold a token at once
-- ARGV[9]   stem      '' (each child's record carries its id) or the stem of derived ids
--                     (the parent's id and '.'): child i's id is then stem .. (start + i - 1)
-- ARGV[10]  start     with a stem: the first child's index (decimal); else ''
-- ARGV[11]  grouped   '1': each child's record ends with its fairness group ('' = none); ''
--                     no record carries one (add.lua)
-- ARGV[12 + width * (i - 1)] ...  child i's record (i = 1..n): its id and its payload (width
--   2) - or, with a stem, its payload only (width 1); grouped, its group follows (width + 1).
--   The host groups children by parent and options, so the shared fields travel once per
--   batch; the stem is checked once, as in add.lua
--
-- Steps: refuse any bad id (or stem) before writing; with check '1', refuse the whole batch (nothing
-- written) when a child's row exists and belongs to anything but this parent (a plain job,
-- another flow's child, the child of a parent of the same id in another queue): landing it
-- would leave this parent waiting for ever. Then for each
-- child whose row does not exist yet, write the row WITH its parent fields AND its policy
-- token, and make it claimable - in this same script, so no child is ever claimable without
-- its policy. A child of this parent that exists is left as it is (a retried add never
-- re-queues a child, even one that already completed, and never admits one twice). With a
-- share, the new children go into the gate instead (their rows marked 'gate', so the host
-- passes the gate's keys to the step that settles them) and the gate admits what fits.
-- The row's 'run' field is '<max_attempts> 0 0 <timeout | -> <created ms> <policy> <gate 0|1>
-- <parent_queue, empty for this queue>': max_attempts and created live only there; the parent
-- fields also have their own (which every other script reads), packed once more for the
-- claim's rows read (includes/run.lua, claiming.ROW_FIELDS) - except the default policy: the
-- field 'parent_policy' is written only for 'id', as 'parent_queue' only for another queue,
-- since every reader, old and new, takes a child without it for 'fp' (fail.lua,
-- recover.lua's host, settle_current.lua, models): two values fewer per child of the usual
-- flow (bench/cpu_per_job.md); rows written with 'fp' spelt out read the same.
-- Full server: refused before it runs (no allow-oom): it may grow memory, so it writes all or
--  nothing.
-- Owner of what it writes: the rows are removed with their flow (the retention sweep); the
-- gate's keys too (forget.lua), see includes/gate.lua.
-- The 'fair' hash (grouped jobs, or a queue that has one): a group's 'g:' field is deleted by
-- the Pump's retention sweep once it is behind the claims (fair_prune.lua); 'max' lives as
-- long as the queue, as 'seq' does (includes/fair.lua). A row's 'group' field goes with the row.
-- Returns: a list of 1 (landed) / 0 (existed), per child.
-- Errors: EMQKIND bad id; EMQTAKEN <id> a child id that is taken (nothing written).
local q = queue_keys(KEYS)
local check, parent, up_queue, policy, attempts = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local timeout, priority, share = ARGV[6], tonumber(ARGV[7]), ARGV[8]
-- job i's payload is ARGV[payload_at + width * (i - 1)]
local stem, width, ids, payload_at = ARGV[9], 2, {}, 13
local grouped = ARGV[11] == '1'
if stem ~= '' then width, payload_at = 1, 12 end
if grouped then width = width + 1 end
local n = (#ARGV - 11) / width
local fk = KEYS[15 + n + 1]
local out = {}
if stem ~= '' then
  local start = tonumber(ARGV[10])
  -- an exact integer index; the ids it makes stay within the id's length bound
  if not start or start < 0 or start ~= math.floor(start) or start >= 2 ^ 52 then
    return redis.error_reply('EMQKIND the start of derived ids must be an integer >= 0: ' ..
      ARGV[10])
  end
  local bad = check_id(stem .. '0')
  if bad or #stem > 188 then
    return redis.error_reply('EMQKIND derived ids need a stem of JOB- plus a safe tail: ' ..
      stem)
  end
  for i = 1, n do ids[i] = stem .. string.format('%d', start + i - 1); out[i] = 1 end
else
  for i = 1, n do
    ids[i] = ARGV[12 + width * (i - 1)]
    local bad = check_id(ids[i])
    if bad then return bad end
    out[i] = 1
  end
end
-- A parent held fresh by this add has no children yet - but a parent of the same id in another
-- queue may have landed children under the same derived ids here: one EXISTS over the whole
-- batch tells, and only then is each row read.
if check == '0' and n > 0 then
  local rows = {}
  for i = 1, n do rows[i] = KEYS[15 + i] end
  if redis.call('EXISTS', unpack(rows)) > 0 then check = '1' end
end
if check == '1' then
  for i = 1, n do
    local row = redis.call('HMGET', KEYS[15 + i], 'payload', 'parent', 'total', 'parent_queue')
    if row[1] or row[3] then
      if row[2] ~= parent or (row[4] or '') ~= up_queue then
        local owner = 'a plain job'
        if row[2] then
          owner = 'a child of ' .. row[2]
          if row[2] == parent then owner = owner .. ' in another queue' end
        elseif row[3] then
          owner = 'a flow parent'
        end
        return redis.error_reply('EMQTAKEN ' .. ids[i] .. ' child id ' ..
          ids[i] .. ' is taken by ' ..
          owner .. ', not free for parent ' .. parent)
      end
      out[i] = 0
    end
  end
end
local groups, tags = {}, nil
for i = 1, n do
  groups[i] = ''
  if grouped then groups[i] = ARGV[payload_at + width * (i - 1) + 1] end
  if #groups[i] > 204 then
    return redis.error_reply('EMQKIND a group is at most 204 characters: ' .. groups[i])
  end
end
if grouped or redis.call('EXISTS', fk) == 1 then tags = fair(fk, q.pending, q.seq, groups, n) end
local seq = 0
if not tags then seq = redis.call('INCRBY', q.seq, n) - n end
-- one HSET per child, the shared fields built once (`run`: see add.lua)
local fields = {'payload', '', 'parent', parent}
if policy ~= 'fp' then fields[#fields + 1] = 'parent_policy'; fields[#fields + 1] = policy end
if up_queue ~= '' then fields[#fields + 1] = 'parent_queue'; fields[#fields + 1] = up_queue end
if timeout ~= '' then fields[#fields + 1] = 'timeout'; fields[#fields + 1] = timeout end
-- a repair re-scores a requeued child by its row (requeue.lua)
if priority > 0 then fields[#fields + 1] = 'priority'; fields[#fields + 1] = ARGV[7] end
if share ~= '' then fields[#fields + 1] = 'gate'; fields[#fields + 1] = '1' end
-- 'run': what a claim needs of the row besides payload and parent, in one value (the rows
-- read asks for each field, present or not: one field instead of seven; includes/run.lua)
local gated = '0'
if share ~= '' then gated = '1' end
local limit = timeout ~= '' and timeout or '-'
fields[#fields + 1] = 'run'
fields[#fields + 1] = attempts .. ' 0 0 ' .. limit .. ' ' .. now_ms() .. ' ' .. policy .. ' ' ..
  gated .. ' ' .. up_queue
local ready, nf = {}, #fields
local base = priority * 1099511627776 + seq
for i = 1, n do
  if out[i] == 1 then
    fields[2] = ARGV[payload_at + width * (i - 1)]
    if groups[i] ~= '' then  -- the row names its group (reads, job.group)
      fields[nf + 1] = 'group'; fields[nf + 2] = groups[i]
    else
      fields[nf + 1] = nil; fields[nf + 2] = nil
    end
    redis.call('HSET', KEYS[15 + i], unpack(fields))
    if tags then
      ready[#ready + 1] = priority * 1099511627776 + tags[i]
    else
      ready[#ready + 1] = base + i
    end
    ready[#ready + 1] = ids[i]
  end
end
if share == '' then
  claimable(q.pending, q.wake, ready)
else
  local gk = {KEYS[15 + n + 2], KEYS[15 + n + 3]}
  redis.call('HSET', gk[2], 'cap', share)
  if #ready > 0 then redis.call('ZADD', gk[1], unpack(ready)) end
  gate(q, gk, 0)
end
return out
