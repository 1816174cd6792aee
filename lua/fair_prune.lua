#!lua flags=allow-oom
-- fair_prune: drop the turns of fairness groups that are behind the claims, a slice at a time.
-- @include claims_turn
--
-- KEYS[1] fair     hash  the queue's fairness tags (includes/fair.lua)
-- KEYS[2] pending  zset  the queue's pending jobs (what the claims take next)
-- ARGV[1] cursor   where the last call's HSCAN stopped ('0': from the start)
-- ARGV[2] count    how many fields to look at (HSCAN's COUNT: bounded work)
--
-- Steps: V as includes/fair.lua finds it (the turn before the lowest tag waiting in pending,
-- front entries of score 0 aside; nothing waiting: the highest tag given); HSCAN one slice of
-- the hash; HDEL every 'g:<group>' field whose tag is at or below V. Such a field says nothing
-- a missing one would not: the group's next job gets tag V + 1 either way, so the turns are
-- the same with or without it - and 100,000 groups that ran once leave nothing behind.
-- Full server: runs (allow-oom): its only write deletes fields.
-- Owner of what it writes: nothing new - it deletes.
-- Returns: {next cursor ('0': the scan went round), fields deleted}.
local fk, pending = KEYS[1], KEYS[2]
local top = redis.call('HGET', fk, 'max')
if not top then return {'0', 0} end
local v = claims_turn(pending, tonumber(top))
local scan = redis.call('HSCAN', fk, ARGV[1], 'COUNT', tonumber(ARGV[2]))
local flat, gone = scan[2], {}
for i = 1, #flat, 2 do
  -- a weighted group's value is '<tag> <n>': its tag is the first number
  if string.sub(flat[i], 1, 2) == 'g:' and tonumber(string.match(flat[i + 1], '^%d+')) <= v then
    gone[#gone + 1] = flat[i]
  end
end
if #gone > 0 then redis.call('HDEL', fk, unpack(gone)) end
return {scan[1], #gone}
