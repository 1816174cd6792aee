-- fair(fk, pending, seq, groups, n): the arrival tags of n jobs about to enter `pending`, taking
-- turns between fairness groups (start-time fair queuing, kept in the pending score).
--   fk      the queue's 'fair' hash: 'max' = the highest tag given so far, 'g:<group>' = the
--           tag of the last job given to <group>
--   pending the queue's pending zset (scores priority * 2^40 + tag)
--   seq     the arrival counter: the first tags of a queue that had no group yet follow it
--   groups  groups[i]: job i's group ('' for a job without one: those share one turn)
-- A group's k-th job gets tag max(last tag of the group, V) + k, where V + 1 is the tag of the
-- job a claim takes next (the lowest tag waiting in pending, front entries of score 0 aside),
-- or - when nothing waits - V is the highest tag given. So tags of every group that has work waiting
-- interleave from V on: one job of each group per tag value, and a claim, which takes pending
-- in score order, serves the groups in turn. A group with 200,000 waiting jobs (tags V+1 ..
-- V+200,000) and fifty added after it with 100 each (tags V'+1 .. V'+100, V' near where the
-- claims are) all progress: each tag value holds one job of each. Priorities still order work
-- first (the priority sits above the tag in the score); within a group, arrival order holds.
-- Jobs that re-enter pending at score 0 (recovered, promoted retries) go first, as ever.
-- Cost: one ZRANGEBYSCORE, one HMGET of the batch's groups, one HSET - per batch, not per job.
-- Owner of what it writes: the 'fair' hash is deleted with its queue (obliterate); a group's
-- field whose tag is at or below V says nothing a fresh group would not (its next job gets
-- V + 1 either way): the Pump's retention sweep deletes those (retain.lua), so idle groups
-- leave nothing behind however many there were.
-- Returns: tags, a list of n numbers (add priority * 2^40 for the score).
local function fair(fk, pending, seq, groups, n)
  local v
  local head = redis.call('ZRANGEBYSCORE', pending, '(0', '+inf', 'LIMIT', 0, 1, 'WITHSCORES')
  local top = redis.call('HGET', fk, 'max')
  if top then top = tonumber(top) else top = tonumber(redis.call('GET', seq) or '0') end
  -- v: the turn before the head's, so a group's first job shares the head's turn
  if head[2] then v = tonumber(head[2]) % 1099511627776 - 1 else v = top end
  local names, at, fields = {}, {}, {}
  for i = 1, n do
    local g = groups[i]
    if not at[g] then
      names[#names + 1] = g; at[g] = #names; fields[#names] = 'g:' .. g
    end
  end
  local last = redis.call('HMGET', fk, unpack(fields))
  local cur = {}
  for j = 1, #names do
    local l = tonumber(last[j] or '0')
    if l < v then l = v end
    cur[j] = l
  end
  local tags = {}
  for i = 1, n do
    local j = at[groups[i]]
    cur[j] = cur[j] + 1
    tags[i] = cur[j]
    if cur[j] > top then top = cur[j] end
  end
  local set = {'max', string.format('%d', top)}
  for j = 1, #names do
    set[#set + 1] = fields[j]; set[#set + 1] = string.format('%d', cur[j])
  end
  redis.call('HSET', fk, unpack(set))
  return tags
end
