#!lua
-- await: a job that spawned children of its own (spawn.lua, own mode) returned from its first
-- run: it leaves its lease and waits for them as their parent, on its own slot.
-- @include now_ms
-- @include queue_keys
-- @include run
-- @include claimable
-- @include signal
-- @include push_signals
--
-- KEYS[1..15] the queue's keys (includes/queue_keys.lua). Used here: active and leases (the
--             run ends), pending and wake (released at once), outbox and outbox_wake (a
--             failure's signal upward)
-- KEYS[16] row           hash    the spawner's row (an inner node since its first own spawn)
-- KEYS[17] dependencies  string  its outstanding-child counter
-- KEYS[18] failed        hash    its children that died under fail-parent (settle_current.lua
--                               recorded them while it ran, and released nothing)
-- ARGV[1] id  ARGV[2] its lease token  ARGV[3] its queue (a parent in it gets no queue name)
--
-- Steps: nothing when the token is not its lease any more (it expired and the job went back to
-- a worker, which runs it again: the re-run spawns the same ids, and ITS return waits; or the
-- flow was cancelled). Otherwise the run ends (out of active and leases) and:
-- * a child that died under fail-parent while it ran fails it, as settle_current.lua fails a
--   held parent: state 'failed' with the error, and a signal of its own death to its parent
--   through this queue's outbox (kind by its policy token: 'f' or 'i');
-- * children still outstanding: state 'held' (settle_current.lua releases it at 0);
-- * none outstanding (they all settled while it ran): state 'pending', claimable now.
-- Released either way, it is claimed again: its handler runs a second time, as a worker-run
-- parent's does (Job.resumed: it reads its children's values). Its attempts start again at 0
-- for that run ('attempts' and the packed 'run' copy): the first run's attempts were spent on
-- the spawning, not on the fan-in.
-- Full server: refused before it runs (no allow-oom): it may grow memory, so it writes all or
--  nothing.
-- Owner of what it writes: the row's fields go with the flow's expiry (drop_node.lua); the
-- pending entry is claimed (its wake member popped by idle workers); the signal is trimmed by
-- the Pump (trim_outbox.lua), its outbox:wake member popped by an idle Pump.
-- Returns: 0 the lease was gone (nothing written), 'h' held, 'r' released, 'f' failed.
local q = queue_keys(KEYS)
local id = ARGV[1]
if redis.call('HGET', q.leases, id) ~= ARGV[2] then return 0 end
redis.call('ZREM', q.active, id)
redis.call('HDEL', q.leases, id)
local now = now_ms()
local dead = redis.call('HSCAN', KEYS[18], 0, 'COUNT', 1)[2]
if #dead > 0 then
  local err = 'child ' .. dead[1] .. ' failed: ' .. dead[2]
  redis.call('HSET', KEYS[16], 'state', 'failed', 'error', err, 'finished', now)
  local up = redis.call('HMGET', KEYS[16], 'parent', 'parent_queue', 'parent_policy')
  if up[1] then
    local kind = 'f'
    if up[3] == 'id' then kind = 'i' end
    push_signals(q.outbox, q.outbox_wake, {signal(kind, id, up[2] or ARGV[3], up[1], err)})
  end
  return 'f'
end
local packed = run(redis.call('HGET', KEYS[16], 'run'), '0', nil)
local fields = {'attempts', 0}
if packed then fields[#fields + 1] = 'run'; fields[#fields + 1] = packed end
if (tonumber(redis.call('GET', KEYS[17])) or 0) > 0 then
  redis.call('HSET', KEYS[16], 'state', 'held', unpack(fields))
  return 'h'
end
redis.call('HSET', KEYS[16], 'state', 'pending', unpack(fields))
claimable(q.pending, q.wake, {0, id})
return 'r'
