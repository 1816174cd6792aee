#!lua flags=allow-oom
-- heartbeat: extend the leases of jobs still held by their callers.
-- @include now_ms
-- @include queue_keys
--
-- KEYS[1..15] the queue's keys (includes/queue_keys.lua). Used here: active (deadlines
--             moved) and leases (read)
-- ARGV[1] lease_ms      the new lease length from now
-- ARGV[2..] id, token   pairs
-- Steps: read every token with one HMGET; for each pair whose token is current, move its
-- deadline to now + lease_ms (one ZADD XX for the batch).
-- Full server: runs (allow-oom): it re-scores members active already holds (ZADD XX) and adds
--  nothing, so leases survive a full server and no job runs twice.
-- Owner of what it writes: it only moves deadlines of existing active entries (ZADD XX): it
-- creates nothing.
-- Returns: a list of 1 (extended) / 0 (lease lost: expired, recovered or re-claimed).
local q = queue_keys(KEYS)
local now = now_ms()
local ids = {}
for i = 2, #ARGV, 2 do ids[#ids + 1] = ARGV[i] end
if #ids == 0 then return {} end
local current = redis.call('HMGET', q.leases, unpack(ids))
local out, act = {}, {}
local deadline = now + tonumber(ARGV[1])
for i = 1, #ids do
  if current[i] == ARGV[2 * i + 1] then
    out[i] = 1
    act[#act + 1] = deadline; act[#act + 1] = ids[i]
  else
    out[i] = 0
  end
end
if #act > 0 then redis.call('ZADD', q.active, 'XX', unpack(act)) end
return out
