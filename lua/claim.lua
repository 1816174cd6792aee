#!lua
-- claim: lease up to `count` jobs of one queue to one caller, in one step, within the queue's
-- rate limit.
-- @include now_ms
-- @include queue_keys
--
-- KEYS[1..15] the queue's keys (includes/queue_keys.lua). Used here: pending (popped), active
--             and leases (the new leases), delayed (due jobs promoted first), wake (passed on)
-- KEYS[16] config       hash    the queue's settings: field 'rate' = '<limit> <window ms>'
--                               (absent: no rate limit)
-- KEYS[17] rate:window  hash    the current rate window: 'start' (ms, a multiple of the
--                               window on the server's clock) and 'count' (starts in it)
-- ARGV[1] count    how many jobs at most
-- ARGV[2] lease_ms how long the lease lasts before the job may be recovered
-- ARGV[3] token    the lease token for this claim (unique per call, made by the host: it names
--                  the claiming worker and the claim's time, workers_registry.lease_token;
--                  complete and fail read them from it, this script only stores it)
-- ARGV[4] promote  how many due delayed jobs to move to pending first (0: leave it to the Pump)
--
-- Steps: promote due delayed jobs (so workers do not depend on a Pump for retries). With a
-- rate limit: find the window now falls in (fixed windows aligned to the server's clock, so
-- every worker and every process counts in the same one), and take at most what it has left;
-- when nothing is left, return at once with the ms until the next window opens. Pop the
-- lowest-scored jobs from pending, score them in active at now + lease_ms, record the token
-- for all of them with ONE HSET, and add them to the window's count. Rows are not touched
-- here: the caller reads them with the rows script (keys derived from ids stay on the host,
-- where Cluster routing sees them). A full batch that leaves jobs behind, with allowance
-- left, sets the wake-up hint again, so the next idle worker (blocked on it) joins in; a
-- batch cut short by the rate does not (a woken worker would find the window spent).
-- Without a rate limit the cost over a plain claim is one HGET.
-- Returns: {wait_ms, id, ...}: the ids in claim order (none when nothing is pending or the
-- window is spent); wait_ms 0, or when the window's allowance is spent (by this claim or
-- before it) the ms until the next window opens - the caller claims again no sooner.
-- Full server: refused before it runs (no allow-oom): it may grow memory, so it writes all or
--  nothing.
-- Owner of what it writes: the active entries and lease tokens are removed by complete, fail,
-- release, recover or cancel_children; the '~roomy' lease field (written only to make the
-- leases hash a hashtable) is deleted by this script before it returns; the wake member is
-- popped by idle workers (one member per queue at most); rate:window expires by itself when
-- its window ends (PEXPIREAT, set whenever a new window starts), so it outlives neither its
-- window nor a removed limit.
local q = queue_keys(KEYS)
local now = now_ms()
local promote = tonumber(ARGV[4])
if promote > 0 then
  local due = redis.call('ZRANGEBYSCORE', q.delayed, '-inf', now, 'LIMIT', 0, promote)
  if #due > 0 then
    local add = {}
    for i = 1, #due do add[#add + 1] = 0; add[#add + 1] = due[i] end
    redis.call('ZADD', q.pending, unpack(add))
    redis.call('ZREM', q.delayed, unpack(due))
  end
end
local take = tonumber(ARGV[1])
local rate = redis.call('HGET', KEYS[16], 'rate')
local limit, start, ends, used
if rate then
  local l, w = string.match(rate, '^(%d+) (%d+)$')
  limit, w = tonumber(l), tonumber(w)
  start = now - now % w
  ends = start + w
  local win = redis.call('HMGET', KEYS[17], 'start', 'count')
  used = 0
  if tonumber(win[1]) == start then used = tonumber(win[2]) end
  if used >= limit then return {ends - now} end
  if limit - used < take then take = limit - used end
end
-- the ids by rank, then the range removed: ZPOPMIN would also reply every score, a string per
-- job made, sent to Lua and dropped
local popped = redis.call('ZRANGE', q.pending, 0, take - 1)
local n = #popped
if n == 0 then return {0} end
redis.call('ZREMRANGEBYRANK', q.pending, 0, n - 1)
local wait = 0
if rate then
  if used == 0 then
    redis.call('HSET', KEYS[17], 'start', start, 'count', n)
    redis.call('PEXPIREAT', KEYS[17], ends)
  else
    redis.call('HINCRBY', KEYS[17], 'count', n)
  end
  if used + n >= limit then wait = ends - now end
end
-- jobs left behind: pass the wake-up on, so another idle worker starts on them now (unless
-- the window is spent: it would only find that out)
if wait == 0 and n == tonumber(ARGV[1]) and redis.call('ZCARD', q.pending) > 0 then
  redis.call('ZADD', q.wake, 0, 'w')
end
local ids, act, lease = {wait}, {}, {}
-- Leases of a big batch as a hashtable, not a listpack: the server keeps a hash of up to
-- hash-max-listpack-entries fields (512 by default in Valkey 9) in a listpack, where every
-- field written, read or deleted scans the whole list - writing a batch of 500 tokens costs
-- many times what a hashtable costs (docs/benchmarks.md), and complete's HMGET / HDEL of them pay again. One
-- value longer than hash-max-listpack-value (64) in the same HSET makes the server build a
-- hashtable; that field ('~' never starts a job id) is deleted again at once.
local roomy = n > 32
if roomy then lease[1] = '~roomy'; lease[2] = string.rep('-', 65) end
-- the deadline as a string once: a Lua number is formatted again for every argument it fills
local deadline = string.format('%d', now + tonumber(ARGV[2]))
for i = 1, n do
  local id = popped[i]
  ids[#ids + 1] = id
  act[#act + 1] = deadline; act[#act + 1] = id
  lease[#lease + 1] = id; lease[#lease + 1] = ARGV[3]
end
-- unpack() is bounded by the Lua stack (about 8,000 values): write in slices of 1,000 jobs
for i = 1, #act, 2000 do
  redis.call('ZADD', q.active, unpack(act, i, math.min(i + 1999, #act)))
end
for i = 1, #lease, 2000 do
  redis.call('HSET', q.leases, unpack(lease, i, math.min(i + 1999, #lease)))
end
if roomy then redis.call('HDEL', q.leases, '~roomy') end
return ids
