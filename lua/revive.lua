-- revive: give dead plain jobs fresh attempts and make them claimable again ("retry" of a dead
-- job in the dashboard and the CLI; a flow's dead children are repaired with their flow).
--
-- KEYS[1] pending  KEYS[2] dead  KEYS[3] wake  KEYS[4] seq   this queue's sets and counter
-- KEYS[4+i] the row of job i
-- ARGV: the job ids, in the order they are to run
-- Steps: a job that is dead and belongs to no flow gets attempts and stalls 0, its state,
-- error and finished time cleared, leaves the morgue and is queued behind what is pending
-- (priority 0, arrival order); its payload, max_attempts and timeout stay. Any other id - a
-- job that is not dead, a flow's child or parent, no row - is left as it is.
-- Owner of what it writes: the pending entries are claimed (claim.lua); the rows are the jobs'
-- own, removed by retention when they finish again; the seq counter is the queue's (one per
-- queue); the wake member is popped by idle workers.
-- Returns: {revived, {ids left as they are}}.
local n = #ARGV
local seq = redis.call('INCRBY', KEYS[4], n) - n
local ready, skipped = {}, {}
for i = 1, n do
  local id, row = ARGV[i], KEYS[4 + i]
  local r = redis.call('HMGET', row, 'state', 'parent', 'total')
  if r[1] == 'dead' and not r[2] and not r[3] then
    redis.call('HSET', row, 'attempts', 0, 'stalls', 0)
    redis.call('HDEL', row, 'state', 'error', 'traceback', 'finished')
    redis.call('ZREM', KEYS[2], id)
    ready[#ready + 1] = seq + i; ready[#ready + 1] = id
  else
    skipped[#skipped + 1] = id
  end
end
if #ready > 0 then
  redis.call('ZADD', KEYS[1], unpack(ready))
  redis.call('ZADD', KEYS[3], 0, 'w')
end
return {#ready / 2, skipped}
