-- tally(key, now, c, f, d): add a batch's counts to this minute's tallies of a queue (the
-- hash `minutes`, keyspace.minutes): c completed, f failed attempts, d of them deaths (the
-- job's last attempt). One field per minute of the day (minute number mod 1440), its value
-- '<minute> <completed> <failed attempts> <deaths>', so a field last written yesterday (another
-- minute number) starts again from zero; a field written before deaths were counted
-- ('<minute> <completed> <failed>') reads as 0 deaths. now: the server's clock (ms, now_ms).
-- Called by complete.lua and fail.lua with what they did (not a script of its own beside
-- them: a full server could then refuse the tally after the batch was written).
-- Owner of what it writes: the hash is overwritten field by field a day later, and expires
-- 25 h after the last batch (PEXPIRE here; no other owner).
local function tally(key, now, c, f, d)
  if c == 0 and f == 0 then return end
  local minute = math.floor(now / 60000)
  local field = tostring(minute % 1440)
  local cur = redis.call('HGET', key, field)
  if cur then
    local at, done, failed, rest = string.match(cur, '^(%d+) (%d+) (%d+)(.*)$')
    if tonumber(at) == minute then
      c, f = c + tonumber(done), f + tonumber(failed)
      d = d + tonumber(string.match(rest, '^ (%d+)$') or '0')
    end
  end
  redis.call('HSET', key, field, minute .. ' ' .. c .. ' ' .. f .. ' ' .. d)
  redis.call('PEXPIRE', key, 90000000)
end
