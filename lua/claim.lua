#!lua
-- claim: lease up to `count` jobs of one queue to one caller, in one step, within the queue's
-- rate limit.
-- @include queue_keys
--
-- KEYS[1..15] the queue's keys (includes/queue_keys.lua). Used here: pending (popped), active
--             and leases (the new leases), delayed (due jobs promoted first), wake (passed on)
-- KEYS[16] config       hash    the queue's settings: field 'rate' = '<limit> <window ms>' or
--                               '<limit> <window ms> <burst>' (absent: no rate limit; no
--                               burst: 1)
-- KEYS[17] rate:tat     string  the rate's theoretical arrival time (GCRA): the µs on the
--                               server's clock from which the next start conforms with no
--                               tolerance used
-- ARGV[1] count    how many jobs at most
-- ARGV[2] lease_ms how long the lease lasts before the job may be recovered
-- ARGV[3] token    the lease token for this claim (unique per call, made by the host: it names
--                  the claiming worker and the claim's time, workers_registry.lease_token;
--                  complete and fail read them from it, this script only stores it)
-- ARGV[4] promote  how many due delayed jobs to move to pending first (0: leave it to the Pump)
--
-- Steps: with a rate limit, a generic cell rate algorithm on the server's clock (µs, so every
-- worker and every process is judged by one clock): starts are due one emission interval
-- T = window / limit apart; the TAT is when the next one is; a start conforms when it comes
-- no earlier than TAT - tau, tau = (burst - 1) * T the tolerance. Take as many as conform now
-- (burst 1, TAT <= now: one; more only by the tolerance); when none does, return at once with
-- the µs until one will (before promoting: when several workers wait on a limit, most claims
-- are turned away). Promote due delayed jobs (so workers do not depend on a Pump for
-- retries). Pop the lowest-scored jobs from pending, score them in active at now + lease_ms,
-- record the token for all of them with ONE HSET, and move the TAT on by T per job taken (a
-- TAT further ahead than this limit books, burst * T, is left of a slower limit since raised:
-- it is brought back to that). Rows are not touched here: the caller reads them with the rows
-- script (keys derived from ids stay on the host, where Cluster routing sees them). A full
-- batch that leaves jobs behind, with a start still conforming, sets the wake-up hint again,
-- so the next idle worker (blocked on it) joins in; a batch cut short by the rate does not (a
-- woken worker would find no start allowed). Without a rate limit the cost over a plain claim
-- is one HGET.
-- Returns: {wait_us, id, ...}: the ids in claim order (none when nothing is pending or no
-- start conforms); wait_us 0, or when no further start conforms now (after this claim or
-- before it) the µs until one does, rounded up (at least 1) - the caller claims again no
-- sooner. In µs, not ms: a claimer that sleeps to the next whole ms arrives late by half a
-- ms on average, and with a burst of 1 what a start comes late is lost to the rate (at 100/s,
-- 5 % of it).
-- Full server: refused before it runs (no allow-oom): it may grow memory, so it writes all or
--  nothing.
-- Owner of what it writes: the active entries and lease tokens are removed by complete, fail,
-- release, recover or cancel_children; the '~roomy' lease field (written only to make the
-- leases hash a hashtable) is deleted by this script before it returns; the wake member is
-- popped by idle workers (one member per queue at most); rate:tat expires by itself at the
-- TAT (PXAT, set with every write), when it no longer constrains a start, so it outlives
-- neither its use nor a removed limit.
local q = queue_keys(KEYS)
-- the server's clock in µs (a Lua double holds µs since the epoch exactly) and in ms
local clock = redis.call('TIME')
local now_us = tonumber(clock[1]) * 1000000 + tonumber(clock[2])
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
local take = tonumber(ARGV[1])
local rate = redis.call('HGET', KEYS[16], 'rate')
local period, tol, tat
if rate then
  local l, w, b = string.match(rate, '^(%d+) (%d+) ?(%d*)$')
  period = tonumber(w) * 1000 / tonumber(l)  -- T, µs
  tol = ((tonumber(b) or 1) - 1) * period
  tat = tonumber(redis.call('GET', KEYS[17])) or now_us
  if tat < now_us then tat = now_us end
  -- a steady limit books at most burst * T ahead; more is left of a slower limit since
  -- raised: the new one holds from its first interval on
  if tat > now_us + tol + period then tat = now_us + tol + period end
  -- the k-th start from now conforms when tat + (k - 1) T <= now + tau (1e-9: a quotient
  -- that is a whole number in exact arithmetic stays one)
  local fits = math.floor((now_us + tol - tat) / period + 1e-9) + 1
  if fits < 1 then return {math.max(1, math.ceil(tat - tol - now_us))} end
  if fits < take then take = fits end
end
-- promoted only by a claim that may start a job (one the rate turned away returned above)
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
-- the ids by rank, then the range removed: ZPOPMIN would also reply every score, a string per
-- job made, sent to Lua and dropped
local popped = redis.call('ZRANGE', q.pending, 0, take - 1)
local n = #popped
if n == 0 then return {0} end
redis.call('ZREMRANGEBYRANK', q.pending, 0, n - 1)
local wait = 0
if rate then
  tat = tat + n * period
  -- '%.3f': tostring keeps 14 digits, too few for µs since the epoch
  redis.call('SET', KEYS[17], string.format('%.3f', tat), 'PXAT', math.ceil(tat / 1000))
  if tat - tol > now_us then wait = math.max(1, math.ceil(tat - tol - now_us)) end
end
-- jobs left behind: pass the wake-up on, so another idle worker starts on them now (unless
-- no start conforms now: it would only find that out)
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
