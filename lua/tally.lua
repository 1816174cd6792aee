-- tally: add a batch's counts to this minute's tallies of a queue: one field per minute of the
-- day (minute number mod 1440), its value '<minute> <completed> <failed attempts> <deaths>',
-- so a field last written yesterday (another minute number) starts again from zero. A field
-- written before deaths were counted ('<minute> <completed> <failed>') reads as 0 deaths.
--
-- KEYS[1] minutes  the queue's minute tallies (hash)
-- ARGV[1] kind     'c' completed, 'f' failed attempts
-- ARGV[2] n        how many the batch holds
-- ARGV[3] deaths   for 'f': how many of those attempts were the job's last (it went to dead, a
--                  child failed for good); absent: 0
-- Steps: the minute from the server's clock (TIME, one clock for every worker), read the
-- field, add, write back; PEXPIRE the hash 25 h, so a queue idle for a day leaves nothing.
-- Owner of what it writes: the hash is overwritten field by field a day later, and expires
-- 25 h after the last batch (no other owner).
-- Returns: the minute number written.
local now = redis.call('TIME')
local minute = math.floor(tonumber(now[1]) / 60)
local field = tostring(minute % 1440)
local c, f, d = 0, 0, 0
local cur = redis.call('HGET', KEYS[1], field)
if cur then
  local at, done, failed, rest = string.match(cur, '^(%d+) (%d+) (%d+)(.*)$')
  if tonumber(at) == minute then
    c, f = tonumber(done), tonumber(failed)
    d = tonumber(string.match(rest, '^ (%d+)$') or '0')
  end
end
local n = tonumber(ARGV[2])
if ARGV[1] == 'c' then
  c = c + n
else
  f = f + n
  d = d + tonumber(ARGV[3] or '0')
end
redis.call('HSET', KEYS[1], field, minute .. ' ' .. c .. ' ' .. f .. ' ' .. d)
redis.call('PEXPIRE', KEYS[1], 90000000)
return minute
