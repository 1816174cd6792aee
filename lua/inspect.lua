#!lua flags=no-writes
-- inspect: a read; one job's row and where it stands, as one consistent snapshot.
-- @include queue_keys
--
-- KEYS[1..15] the queue's keys (includes/queue_keys.lua). Used here: active, pending, delayed,
--             dead and completed (read, in that order: where the job stands)
-- KEYS[16] row  the job's row
-- ARGV[1] id
-- Full server: runs (no-writes): it only reads.
-- Owner of what it writes: nothing; a read, it creates no key.
-- Returns: {where, score, row}: `where` is 'active' | 'pending' | 'delayed' | 'dead' |
-- 'completed' | '' (a held or failed parent is in no set; its row says which), score is the
-- job's score there (a deadline, a due or finish time in ms) or false, row is the flat HGETALL
-- of the row ({} if none, e.g. a plain job completed with keep_completed=False).
local q = queue_keys(KEYS)
local sets = {{q.active, 'active'}, {q.pending, 'pending'}, {q.delayed, 'delayed'},
  {q.dead, 'dead'}, {q.completed, 'completed'}}
for _, s in ipairs(sets) do
  local score = redis.call('ZSCORE', s[1], ARGV[1])
  if score then return {s[2], score, redis.call('HGETALL', KEYS[16])} end
end
return {'', false, redis.call('HGETALL', KEYS[16])}
