-- hold: the first step of adding a flow; hold a parent on its own slot with its counter.
-- @include check_id
-- @include now_ms
--
-- KEYS[1] row           hash    the parent's row
-- KEYS[2] dependencies  string  the parent's outstanding-child counter
-- ARGV[1] id            the parent id
-- ARGV[2] payload       the parent's payload (serialised)
-- ARGV[3] total         N, ALL its children, same-queue and cross-queue together
-- ARGV[4] max_attempts
-- ARGV[5] parent        '' for a root; else the id of this parent's own parent (nested flows)
-- ARGV[6] parent_queue  '' when that parent is in this queue, else its queue
-- ARGV[7] policy        this node's own failure-policy token toward its parent: 'fp' | 'id'
-- ARGV[8] fingerprint   a digest of this parent's children (their queues and ids, in order),
--                       made by the host: a re-add with other children is refused, not merged
-- ARGV[9] timeout_ms    the parent's own handler time limit ('' = the queue's)
--
-- Steps: a parent that already exists is left exactly as it is (holding never resets a
-- counter: a retried add converges instead of starting over) - provided it is the SAME flow:
-- same N, same fingerprint, same parent of its own; otherwise the row is written in state
-- 'held' and the counter set to N, in this one script, so the counter exists before any child
-- can complete. Two different adds racing on one id: one holds, the other is refused here.
-- Owner of what it writes: the row and the counter are removed with the flow (the retention
-- sweep of the parent queue, sweep.lua), never by this script.
-- Returns: 1 held now, 0 already existed (the same flow).
-- Errors: EMQKIND bad id; EMQFLOW the id exists and is not this flow's parent.
local bad = check_id(ARGV[1])
if bad then return bad end
local row = redis.call('HMGET', KEYS[1], 'total', 'fp', 'parent')
if row[1] then
  if (row[3] or '') ~= ARGV[5] then
    local owner = 'a root flow parent'
    if row[3] then owner = 'a child of ' .. row[3] end
    return redis.error_reply('EMQFLOW id ' .. ARGV[1] .. ' is taken by ' .. owner)
  end
  if row[1] ~= ARGV[3] then
    return redis.error_reply('EMQFLOW parent ' .. ARGV[1] .. ' exists with ' .. row[1] ..
      ' children, not ' .. ARGV[3])
  end
  if row[2] and row[2] ~= ARGV[8] then
    return redis.error_reply('EMQFLOW parent ' .. ARGV[1] .. ' exists with ' .. row[1] ..
      ' other children (other ids or queues)')
  end
  return 0
end
if redis.call('EXISTS', KEYS[1]) == 1 then
  return redis.error_reply('EMQFLOW id ' .. ARGV[1] .. ' is taken by a job that is not a flow parent')
end
redis.call('HSET', KEYS[1], 'state', 'held', 'payload', ARGV[2], 'total', ARGV[3],
  'max_attempts', ARGV[4], 'created', now_ms(), 'fp', ARGV[8])
if ARGV[9] ~= '' then redis.call('HSET', KEYS[1], 'timeout', ARGV[9]) end
if ARGV[5] ~= '' then
  redis.call('HSET', KEYS[1], 'parent', ARGV[5], 'parent_policy', ARGV[7])
  if ARGV[6] ~= '' then redis.call('HSET', KEYS[1], 'parent_queue', ARGV[6]) end
end
redis.call('SET', KEYS[2], ARGV[3])
return 1
