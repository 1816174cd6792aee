#!lua
-- cancel_job: cancel plain jobs that have not started (pending or delayed): they go to the
-- morgue with the reason as their error, so a retry (revive.lua) can bring them back.
-- @include now_ms
-- @include queue_keys
--
-- KEYS[1..15] the queue's keys (includes/queue_keys.lua). Used here: pending and delayed (the
--             jobs leave them), dead (they enter it)
-- KEYS[15+i]  the row of job i
-- ARGV[1] reason  the error recorded: 'cancelled: <reason>' (or 'cancelled')
-- ARGV[1+i] the id of job i
-- Steps: a job that is pending or delayed and belongs to no flow (no parent, not a parent:
-- a flow's child is cancelled with its flow, cancel.lua) leaves its set, gets state 'dead',
-- the error and a finished time, and enters `dead` scored now. Any other id - leased,
-- finished, dead, a flow's node, no row - is left as it is.
-- Full server: refused before it runs (no allow-oom): it may grow memory, so it writes all or
--  nothing.
-- Owner of what it writes: the rows and dead entries are removed by the dead retention sweep
-- of the queue (retain.lua), or taken back out by revive.lua.
-- Returns: {cancelled, {ids left as they are}}.
local q = queue_keys(KEYS)
local now = now_ms()
local err = 'cancelled'
if ARGV[1] ~= '' then err = 'cancelled: ' .. ARGV[1] end
local done, skipped = {}, {}
for i = 2, #ARGV do
  local id, row = ARGV[i], KEYS[14 + i]
  local r = redis.call('HMGET', row, 'parent', 'total', 'payload')
  local gone = 0
  if r[3] and not r[1] and not r[2] then
    gone = redis.call('ZREM', q.pending, id) + redis.call('ZREM', q.delayed, id)
  end
  if gone > 0 then
    redis.call('HSET', row, 'state', 'dead', 'error', err, 'finished', now)
    done[#done + 1] = now; done[#done + 1] = id
  else
    skipped[#skipped + 1] = id
  end
end
if #done > 0 then redis.call('ZADD', q.dead, unpack(done)) end
return {#done / 2, skipped}
