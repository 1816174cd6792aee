#!lua flags=allow-oom
-- release: give leased jobs back to pending untouched (a worker shutting down gracefully).
-- @include queue_keys
-- @include claimable
--
-- KEYS[1..15] the queue's keys (includes/queue_keys.lua). Used here: active and leases (the
--             leases end), pending and wake (the jobs are claimable again)
-- ARGV[1..] id, token pairs
-- Steps: for each pair whose token is current: drop it from active and leases and put it at
-- the FRONT of pending (score 0). No attempt or stall is counted: the job never ran, or its
-- run was abandoned by a clean shutdown. Returns: a list of 1 (released) / 0 (lease lost).
-- Full server: runs (allow-oom): each job moves from active to pending and its lease entry goes: it
--  frees at least what it adds.
-- Owner of what it writes: pending entries are claimed; the wake member is popped by idle
-- workers.
local q = queue_keys(KEYS)
local ids = {}
for i = 1, #ARGV, 2 do ids[#ids + 1] = ARGV[i] end
if #ids == 0 then return {} end
local current = redis.call('HMGET', q.leases, unpack(ids))
local out, back, gone = {}, {}, {}
for i = 1, #ids do
  if current[i] == ARGV[2 * i] then
    out[i] = 1
    gone[#gone + 1] = ids[i]
    back[#back + 1] = 0; back[#back + 1] = ids[i]
  else
    out[i] = 0
  end
end
if #gone > 0 then
  redis.call('ZREM', q.active, unpack(gone))
  redis.call('HDEL', q.leases, unpack(gone))
end
claimable(q.pending, q.wake, back)
return out
