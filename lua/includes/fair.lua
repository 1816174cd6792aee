-- @include claims_turn
-- fair(fk, pending, seq, groups, n): the arrival tags of n jobs about to enter `pending`, taking
-- turns between fairness groups (start-time fair queuing, kept in the pending score).
--   fk      the queue's 'fair' hash: 'max' = the highest tag given so far, 'g:<group>' = the
--           tag of the last job given to <group> ('<tag> <n>' while a weighted group has given
--           n < its weight jobs that turn), 'w:<group>' = a group's weight: the jobs it gets per
--           turn (absent: 1; set by the host, control/groups.py)
--   pending the queue's pending zset (scores priority * 2^40 + tag)
--   seq     the arrival counter: the first tags of a queue that had no group yet follow it
--   groups  groups[i]: job i's group ('' for a job without one: those share one turn)
-- A group's k-th job gets tag max(last tag of the group, V) + k (with a weight w: w jobs per
-- tag), where V + 1 is the tag of the job a claim takes next (the lowest tag waiting in
-- pending, front entries of score 0 aside), or - when nothing waits - V is the highest tag
-- given. So tags of every group that has work waiting
-- interleave from V on: one job of each group per tag value, and a claim, which takes pending
-- in score order, serves the groups in turn. A group with 200,000 waiting jobs (tags V+1 ..
-- V+200,000) and fifty added after it with 100 each (tags V'+1 .. V'+100, V' near where the
-- claims are) all progress: each tag value holds one job of each. Priorities still order work
-- first (the priority sits above the tag in the score); within a group, arrival order holds.
-- Jobs that re-enter pending at score 0 (recovered, promoted retries) go first, as ever.
-- Cost: one ZRANGEBYSCORE, one HMGET of the batch's groups, one HSET - per batch, not per job.
-- Owner of what it writes: the 'fair' hash lives as long as its queue, as `seq` does; a
-- group's 'g:' field whose tag is at or below V says nothing a fresh group would not (its next
-- job gets V + 1 either way): the Pump's retention sweep deletes those (fair_prune.lua), so
-- idle groups leave nothing behind however many there were. 'w:' fields are the host's
-- (control/groups.py deletes one when its weight goes back to 1).
-- Returns: tags, a list of n numbers (add priority * 2^40 for the score).
local function fair(fk, pending, seq, groups, n)
  local top = redis.call('HGET', fk, 'max')
  if top then top = tonumber(top) else top = tonumber(redis.call('GET', seq) or '0') end
  local v = claims_turn(pending, top)
  local names, at, fields = {}, {}, {}
  for i = 1, n do
    local g = groups[i]
    if not at[g] then
      names[#names + 1] = g; at[g] = #names
      fields[#fields + 1] = 'g:' .. g; fields[#fields + 1] = 'w:' .. g
    end
  end
  local got = redis.call('HMGET', fk, unpack(fields))
  -- per group: its turn t, the jobs u it gave that turn, its weight w (jobs per turn)
  local t, u, w = {}, {}, {}
  for j = 1, #names do
    local tag, used = string.match(got[2 * j - 1] or '0', '^(%d+) ?(%d*)$')
    w[j] = tonumber(got[2 * j] or '1')
    t[j] = tonumber(tag or '0')
    u[j] = tonumber(used) or w[j]  -- a bare turn is a full one
    if t[j] <= v then t[j] = v; u[j] = w[j] end  -- behind the claims: start at the head's turn
  end
  local tags = {}
  for i = 1, n do
    local j = at[groups[i]]
    if u[j] < w[j] then u[j] = u[j] + 1 else t[j] = t[j] + 1; u[j] = 1 end
    tags[i] = t[j]
    if t[j] > top then top = t[j] end
  end
  local set = {'max', string.format('%d', top)}
  for j = 1, #names do
    local value = string.format('%d', t[j])
    if u[j] < w[j] then value = value .. ' ' .. u[j] end
    set[#set + 1] = fields[2 * j - 1]; set[#set + 1] = value
  end
  redis.call('HSET', fk, unpack(set))
  return tags
end
