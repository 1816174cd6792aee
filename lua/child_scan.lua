#!lua flags=no-writes
-- child_scan: a read; the next derived children of a flow node, in spec order, that have
-- settled a given way (or not at all), walking at most a budget of positions.
--
-- KEYS[1] processed     hash  child id -> result (completed children)
-- KEYS[2] failed        hash  child id -> error (died under fail-parent)
-- KEYS[3] unsuccessful  hash  child id -> error (died under ignore-on-failure)
-- ARGV[1] stem    what the node's derived ids start with (`<id>.` or `<id>.g<n>.`)
-- ARGV[2] start   the first position to look at (0-based)
-- ARGV[3] stop    one past the last position (the node's N)
-- ARGV[4] want    'completed' | 'failed' | 'ignored' | 'pending' (in none of the three)
-- ARGV[5] count   how many matches at most
-- ARGV[6] budget  how many positions at most (the bound on the work: <= 3 HEXISTS each)
-- Why a script: the three membership tests per position stay on the server (no values travel,
-- one round trip), and the walk stops at `count` matches or `budget` positions, whichever is
-- first - never a scan of the whole flow. Children whose ids were given explicitly are not
-- derived positions and are not walked.
-- Full server: runs (no-writes): it only reads (HEXISTS).
-- Owner of what it writes: nothing; a read, it creates no key.
-- Returns: {next, id, ...}: the matching ids in position order; next is the position to go on
-- from, or -1 when the walk reached `stop`.
local stem, pos, stop = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local want, count = ARGV[4], tonumber(ARGV[5])
local last = math.min(stop, pos + tonumber(ARGV[6]))
local out = {-1}
while pos < last and #out - 1 < count do
  local id = stem .. pos
  local hit
  if want == 'completed' then
    hit = redis.call('HEXISTS', KEYS[1], id) == 1
  elseif want == 'failed' then
    hit = redis.call('HEXISTS', KEYS[2], id) == 1
  elseif want == 'ignored' then
    hit = redis.call('HEXISTS', KEYS[3], id) == 1
  else
    hit = redis.call('HEXISTS', KEYS[1], id) + redis.call('HEXISTS', KEYS[2], id) +
      redis.call('HEXISTS', KEYS[3], id) == 0
  end
  if hit then out[#out + 1] = id end
  pos = pos + 1
end
if pos < stop then out[1] = pos end
return out
