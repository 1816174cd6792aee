-- claimable(pending, wake, entries): make jobs claimable and set the idle workers' wake-up
-- hint. entries = flat {score, id, ...} for ZADD; nothing is written when it is empty. Every
-- script that makes jobs claimable does it here, so no such script forgets the hint (the hint
-- is never needed for correctness: a worker also claims on its poll).
-- Owner of what it writes: the pending entries are claimed (claim.lua); the wake member (one
-- per queue at most) is popped by idle workers.
local function claimable(pending, wake, entries)
  if #entries == 0 then return end
  redis.call('ZADD', pending, unpack(entries))
  redis.call('ZADD', wake, 0, 'w')
end
