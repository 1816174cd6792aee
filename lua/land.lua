-- land: land a batch of a flow's leaf children on their own queue's slot, claimable at once.
-- @include check_id
--
-- KEYS[1]   pending   zset  this queue's claimable jobs
-- KEYS[2]   seq       string  this queue's arrival counter (see add.lua)
-- KEYS[3]   wake      zset  set when jobs become claimable (idle workers block on it)
-- KEYS[3+i] the row of child i (i = 1..n)
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
-- then per child, 2 values: id, payload (the host groups children by parent and options, so
--   the shared fields travel once per batch)
--
-- Steps: refuse any bad id before writing; with check '1', refuse the whole batch (nothing
-- written) when a child's row exists and belongs to anything but this parent (a plain job,
-- another flow's child, the child of a parent of the same id in another queue): landing it
-- would leave this parent waiting for ever. Then for each
-- child whose row does not exist yet, write the row WITH its parent fields AND its policy
-- token, and make it claimable - in this same script, so no child is ever claimable without
-- its policy. A child of this parent that exists is left as it is (a retried add never
-- re-queues a child, even one that already completed).
-- Owner of what it writes: the rows are removed with their flow (the retention sweep).
-- Returns: a list of 1 (landed) / 0 (existed), per child.
-- Errors: EMQKIND bad id; EMQTAKEN <id> a child id that is taken (nothing written).
local check, parent, up_queue, policy, attempts = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local timeout = ARGV[6]
local n = (#ARGV - 6) / 2
local out = {}
for i = 1, n do
  local bad = check_id(ARGV[5 + 2 * i])
  if bad then return bad end
  out[i] = 1
end
-- A parent held fresh by this add has no children yet - but a parent of the same id in another
-- queue may have landed children under the same derived ids here: one EXISTS over the whole
-- batch tells, and only then is each row read.
if check == '0' and n > 0 then
  local rows = {}
  for i = 1, n do rows[i] = KEYS[3 + i] end
  if redis.call('EXISTS', unpack(rows)) > 0 then check = '1' end
end
if check == '1' then
  for i = 1, n do
    local row = redis.call('HMGET', KEYS[3 + i], 'payload', 'parent', 'total', 'parent_queue')
    if row[1] or row[3] then
      if row[2] ~= parent or (row[4] or '') ~= up_queue then
        local owner = 'a plain job'
        if row[2] then
          owner = 'a child of ' .. row[2]
          if row[2] == parent then owner = owner .. ' in another queue' end
        elseif row[3] then
          owner = 'a flow parent'
        end
        return redis.error_reply('EMQTAKEN ' .. ARGV[5 + 2 * i] .. ' child id ' ..
          ARGV[5 + 2 * i] .. ' is taken by ' ..
          owner .. ', not free for parent ' .. parent)
      end
      out[i] = 0
    end
  end
end
local seq = redis.call('INCRBY', KEYS[2], n) - n
-- one HSET per child, the shared fields built once
local fields = {'payload', '', 'parent', parent, 'parent_policy', policy, 'max_attempts', attempts}
if up_queue ~= '' then fields[#fields + 1] = 'parent_queue'; fields[#fields + 1] = up_queue end
if timeout ~= '' then fields[#fields + 1] = 'timeout'; fields[#fields + 1] = timeout end
local ready = {}
for i = 1, n do
  if out[i] == 1 then
    fields[2] = ARGV[6 + 2 * i]
    redis.call('HSET', KEYS[3 + i], unpack(fields))
    ready[#ready + 1] = seq + i; ready[#ready + 1] = ARGV[5 + 2 * i]
  end
end
if #ready > 0 then
  redis.call('ZADD', KEYS[1], unpack(ready))
  redis.call('ZADD', KEYS[3], 0, 'w')
end
return out
