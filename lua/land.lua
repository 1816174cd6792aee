-- land: land a batch of a flow's leaf children on their own queue's slot, claimable at once.
-- @include check_id
--
-- KEYS[1]   pending   zset  this queue's claimable jobs
-- KEYS[2]   seq       string  this queue's arrival counter (see add.lua)
-- KEYS[3]   wake      zset  set when jobs become claimable (idle workers block on it)
-- KEYS[3+i] the row of child i (i = 1..n)
-- ARGV[1]   check     '1': skip children whose row exists; '0': their parent was held fresh by
--                     this very add and their ids derive from it, so no row can exist yet
--                     (saves one EXISTS per child on the first attempt; a retry always checks)
-- ARGV[2]   parent id  the parent every child of this batch settles into
-- ARGV[3]   parent_queue  '' = the parent is in this queue (the same-queue fan-in); else the
--                     parent's queue (the outbox path)
-- ARGV[4]   policy    'fp' | 'id': the children's failure-policy token
-- ARGV[5]   max_attempts
-- then per child, 2 values: id, payload (the host groups children by parent and options, so
--   the shared fields travel once per batch)
--
-- Steps: refuse any bad id before writing; then for each child whose row does not exist yet,
-- write the row WITH its parent fields AND its policy token, and make it claimable - in this
-- same script, so no child is ever claimable without its policy. A child that exists is left
-- as it is (a retried add never re-queues a child, even one that already completed).
-- Returns: a list of 1 (landed) / 0 (existed), per child. Errors: EMQKIND.
local check, parent, up_queue, policy, attempts = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local n = (#ARGV - 5) / 2
for i = 1, n do
  local bad = check_id(ARGV[4 + 2 * i])
  if bad then return bad end
end
local seq = redis.call('INCRBY', KEYS[2], n) - n
local out, ready = {}, {}
for i = 1, n do
  local id, row = ARGV[4 + 2 * i], KEYS[3 + i]
  if check == '1' and redis.call('EXISTS', row) == 1 then
    out[i] = 0
  else
    if up_queue == '' then
      redis.call('HSET', row, 'payload', ARGV[5 + 2 * i], 'parent', parent,
        'parent_policy', policy, 'max_attempts', attempts)
    else
      redis.call('HSET', row, 'payload', ARGV[5 + 2 * i], 'parent', parent,
        'parent_queue', up_queue, 'parent_policy', policy, 'max_attempts', attempts)
    end
    ready[#ready + 1] = seq + i; ready[#ready + 1] = id
    out[i] = 1
  end
end
if #ready > 0 then
  redis.call('ZADD', KEYS[1], unpack(ready))
  redis.call('ZADD', KEYS[3], 0, 'w')
end
return out
