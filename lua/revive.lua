#!lua
-- revive: give dead plain jobs fresh attempts and make them claimable again ("retry" of a dead
-- job in the dashboard and the CLI; a flow's dead children are repaired with their flow).
-- @include queue_keys
-- @include claimable
-- @include run
--
-- KEYS[1..15] the queue's keys (includes/queue_keys.lua). Used here: dead (the morgue), pending
--             and wake (revived jobs), seq (the arrival counter)
-- KEYS[15+i]  the row of job i
-- ARGV[1..] the job ids, in the order they are to run
-- Steps: a job that is dead and belongs to no flow gets attempts and stalls 0, its state,
-- error and finished time cleared, leaves the morgue and is queued behind what is pending
-- (priority 0, arrival order); its payload, max_attempts and timeout stay. Any other id - a
-- job that is not dead, a flow's child or parent, no row - is left as it is.
-- Full server: refused before it runs (no allow-oom): it may grow memory, so it writes all or
--  nothing.
-- Owner of what it writes: the pending entries are claimed (claim.lua); the rows (and their
-- fields reset here, 'run' among them) are the jobs' own, removed by retention when they finish
-- again; the seq counter is the queue's (one per queue); the wake member is popped by idle
-- workers.
-- Returns: {revived, {ids left as they are}}.
local q = queue_keys(KEYS)
local n = #ARGV
local seq = redis.call('INCRBY', q.seq, n) - n
local ready, skipped = {}, {}
for i = 1, n do
  local id, row = ARGV[i], KEYS[15 + i]
  local r = redis.call('HMGET', row, 'state', 'parent', 'total', 'run')
  if r[1] == 'dead' and not r[2] and not r[3] then
    local packed = run(r[4], 0, 0)  -- the claim's copy (includes/run.lua), if the row has one
    if packed then
      redis.call('HSET', row, 'attempts', 0, 'stalls', 0, 'run', packed)
    else
      redis.call('HSET', row, 'attempts', 0, 'stalls', 0)
    end
    redis.call('HDEL', row, 'state', 'error', 'traceback', 'finished')
    redis.call('ZREM', q.dead, id)
    ready[#ready + 1] = seq + i; ready[#ready + 1] = id
  else
    skipped[#skipped + 1] = id
  end
end
claimable(q.pending, q.wake, ready)
return {#ready / 2, skipped}
