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
--
-- Steps: a parent that already exists is left exactly as it is (holding never resets a
-- counter: a retried add converges instead of starting over); otherwise the row is written
-- in state 'held' and the counter set to N, in this one script, so the counter exists before
-- any child can complete.
-- Returns: 1 held now, 0 already existed (same N).
-- Errors: EMQKIND bad id; EMQFLOW the id exists but is not a parent of N children.
local bad = check_id(ARGV[1])
if bad then return bad end
local total = redis.call('HGET', KEYS[1], 'total')
if total then
  if total ~= ARGV[3] then
    return redis.error_reply('EMQFLOW parent ' .. ARGV[1] .. ' exists with ' .. total ..
      ' children, not ' .. ARGV[3])
  end
  return 0
end
if redis.call('EXISTS', KEYS[1]) == 1 then
  return redis.error_reply('EMQFLOW id ' .. ARGV[1] .. ' is already used by a job that is not a flow parent')
end
redis.call('HSET', KEYS[1], 'state', 'held', 'payload', ARGV[2], 'total', ARGV[3],
  'max_attempts', ARGV[4], 'created', now_ms())
if ARGV[5] ~= '' then
  redis.call('HSET', KEYS[1], 'parent', ARGV[5], 'parent_policy', ARGV[7])
  if ARGV[6] ~= '' then redis.call('HSET', KEYS[1], 'parent_queue', ARGV[6]) end
end
redis.call('SET', KEYS[2], ARGV[3])
return 1
