-- @include claimable
-- gate(q, gk, freed, hand): the cap gate of one parent's children in one queue, on that queue's slot.
--   q     = the queue's keys (queue_keys.lua): pending and wake (admitted children)
--   gk    = {waiting, cap} keys of the gate (keyspace.gate_keys): the zset of children waiting
--           for a token, scored as in pending (priority * 2^40 + arrival number), and the hash
--           {cap = this queue's share of the flow's max_running, admitted = children holding a
--           token, off = '1' once the flow was cancelled}
--   freed = how many tokens the caller's step returns: children of this gate that settled for
--           good in that step (completed, dead, cancelled); 0 to admit only (land, requeue)
--   hand  = nil, or the hand-off of the completing worker (includes/hand.lua): up to hand.room
--           admitted children are leased to it at once (active + leases, as claim.lua leases)
--           instead of going to pending, their ids appended to hand.ids - the token cycle then
--           skips the wake-up and the claim of an idle worker. A handed-off child is admitted
--           and leased: it counts within the cap like any other, and its lease is a normal one
--           (recover.lua returns it on expiry, heartbeat.lua extends it, release.lua takes it
--           back).
-- Returns the tokens, then moves the head of `waiting` into pending while admitted < cap (not
-- once `off`). A child keeps its token while it is pending, leased or waiting for a retry, so
-- admitted <= cap, hence leased <= cap, whatever the number of workers. An admitted child
-- keeps its gate score in pending, so priority and arrival order hold across the gate.
-- Owner of what it writes: the pending entries are claimed (claim.lua); `waiting` is emptied
-- by admissions and by cancel_children.lua; both keys are deleted with the flow (forget.lua).
-- Returns: how many children it admitted.
local function gate(q, gk, freed, hand)
  local conf = redis.call('HMGET', gk[2], 'cap', 'admitted', 'off')
  local admitted = tonumber(conf[2] or '0')
  if freed > 0 then
    admitted = math.max(0, admitted - freed)
    redis.call('HSET', gk[2], 'admitted', admitted)
  end
  local room = tonumber(conf[1] or '0') - admitted
  if conf[3] or room <= 0 then return 0 end
  local head = redis.call('ZPOPMIN', gk[1], room)
  if #head == 0 then return 0 end
  local ready = {}
  for i = 1, #head, 2 do
    if hand and hand.room > 0 then
      hand.room = hand.room - 1
      hand.ids[#hand.ids + 1] = head[i]
      redis.call('ZADD', q.active, hand.deadline, head[i])
      redis.call('HSET', q.leases, head[i], hand.token)
    else
      ready[#ready + 1] = head[i + 1]; ready[#ready + 1] = head[i]
    end
  end
  redis.call('HSET', gk[2], 'admitted', admitted + #head / 2)
  claimable(q.pending, q.wake, ready)
  return #head / 2
end
