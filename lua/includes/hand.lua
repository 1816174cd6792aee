-- hand(spec, config, now): the hand-off of a completing worker, read from its spec (ARGV) -
-- '' (none: a plain Queue.complete / fail caller, which has no buffer to take jobs into) or
-- '<lease token> <lease_ms> <room>': the lease to give the children this step admits, and
-- how many at most (the worker's free runners). config = the queue's config hash (claim.lua):
-- a queue with a rate limit gets no hand-off - its starts are counted by claims only, so its
-- admitted children go to pending and are claimed within the limit.
-- Returns nil (no hand-off) or {token, deadline, room, ids = {}} for gate() (includes/gate.lua).
-- Owner of what it writes: nothing (gate() writes the leases; their owners are claim.lua's).
local function hand(spec, config, now)
  if spec == '' then return nil end
  local token, ms, room = string.match(spec, '^(%S+) (%d+) (%d+)$')
  room = tonumber(room)
  if not token or room == 0 then return nil end
  if redis.call('HEXISTS', config, 'rate') == 1 then return nil end
  return {token = token, deadline = now + tonumber(ms), room = room, ids = {}}
end
