#!lua
-- cancel_children: on one child queue's slot, cancel the children of a cancelled node.
-- @include now_ms
-- @include queue_keys
--
-- KEYS[1..15] the queue's keys (includes/queue_keys.lua). Used here: pending, delayed, active
--             and leases (the children leave them)
-- KEYS[16] KEYS[17]  the gate (waiting, cap) of the node's children in this queue
--             (includes/gate.lua; absent keys when the node has no cap)
-- KEYS[17+j]  the row of candidate child j (ARGV[1+j])
-- ARGV[1] parent  the cancelled node's id
-- then the candidate child ids (the node's derived ids and its explicit ids of this queue;
--   one without a row here, or with another parent, is skipped)
--
-- Steps: for each child of `parent`: a pending or delayed (retrying) one leaves its set; a
-- leased one loses its lease (the worker that holds it drops it before it starts - its
-- heartbeat finds the lease gone - and a running handler's report is refused by its token);
-- each of those gets state 'cancelled', and so does a child waiting in the gate (it leaves the
-- gate; a gated child that held a token returns it, and the gate is marked off, so no
-- completion arriving meanwhile admits another). A child that completed or died is left as
-- it is. A
-- child that is a parent itself is named in the reply: the host cancels it (cancel.lua) and
-- then its own children.
-- Full server: refused before it runs (no allow-oom): it may grow memory, so it writes all or
--  nothing.
-- Owner of what it writes: the children's rows (state 'cancelled') go with their flow's expiry
-- (forget.lua); nothing else is created (entries are only removed from pending, delayed,
-- active, leases, the gate; the gate's cap hash gets 'off' and its count, and goes with the
-- flow's expiry - a repair takes 'off' away, requeue.lua).
-- Returns: {cancelled, {inner node ids}}.
local q = queue_keys(KEYS)
local cancelled, inner = 0, {}
local now = now_ms()
local gk = {KEYS[16], KEYS[17]}
local held = 0  -- gated children that held a token
for j = 1, #ARGV - 1 do
  local id, row = ARGV[1 + j], KEYS[17 + j]
  local up = redis.call('HMGET', row, 'parent', 'total', 'gate')
  if up[1] == ARGV[1] then
    if up[2] then
      inner[#inner + 1] = id
    else
      local hit = redis.call('ZREM', q.pending, id) + redis.call('ZREM', q.delayed, id)
      if redis.call('ZREM', q.active, id) == 1 then
        redis.call('HDEL', q.leases, id)
        hit = 1
      end
      if up[3] then
        if hit > 0 then held = held + 1 end
        hit = hit + redis.call('ZREM', gk[1], id)
      end
      if hit > 0 then
        redis.call('HSET', row, 'state', 'cancelled', 'cancelled', now)
        cancelled = cancelled + 1
      end
    end
  end
end
if redis.call('EXISTS', gk[2]) == 1 then
  redis.call('HSET', gk[2], 'off', '1')
  if held > 0 then redis.call('HINCRBY', gk[2], 'admitted', -held) end
end
return {cancelled, inner}
