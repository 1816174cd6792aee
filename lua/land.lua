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
-- ARGV[2]   n
-- then per child, 6 values: id, payload, parent id, parent_queue ('' = the parent is in this
--   queue: the same-queue fan-in; else the parent's queue: the outbox path), policy ('fp'|'id'),
--   max_attempts
--
-- Steps: refuse any bad id before writing; then for each child whose row does not exist yet,
-- write the row WITH its parent fields AND its policy token, and make it claimable - in this
-- same script, so no child is ever claimable without its policy. A child that exists is left
-- as it is (a retried add never re-queues a child, even one that already completed).
-- Returns: a list of 1 (landed) / 0 (existed), per child. Errors: EMQKIND.
local check, n = ARGV[1], tonumber(ARGV[2])
for i = 0, n - 1 do
  local bad = check_id(ARGV[3 + i * 6])
  if bad then return bad end
end
local seq = redis.call('INCRBY', KEYS[2], n) - n
local out, ready = {}, {}
for i = 0, n - 1 do
  local b = 3 + i * 6
  local row = KEYS[4 + i]
  if check == '1' and redis.call('EXISTS', row) == 1 then
    out[i + 1] = 0
  else
    if ARGV[b + 3] == '' then
      redis.call('HSET', row, 'payload', ARGV[b + 1], 'parent', ARGV[b + 2],
        'parent_policy', ARGV[b + 4], 'max_attempts', ARGV[b + 5])
    else
      redis.call('HSET', row, 'payload', ARGV[b + 1], 'parent', ARGV[b + 2],
        'parent_queue', ARGV[b + 3], 'parent_policy', ARGV[b + 4], 'max_attempts', ARGV[b + 5])
    end
    ready[#ready + 1] = seq + i + 1; ready[#ready + 1] = ARGV[b]
    out[i + 1] = 1
  end
end
if #ready > 0 then
  redis.call('ZADD', KEYS[1], unpack(ready))
  redis.call('ZADD', KEYS[3], 0, 'w')
end
return out
