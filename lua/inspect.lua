-- inspect: a read; one job's row and where it stands, as one consistent snapshot.
--
-- KEYS[1] row  KEYS[2] pending  KEYS[3] active  KEYS[4] delayed  KEYS[5] dead
-- KEYS[6] completed
-- ARGV[1] id
-- Owner of what it writes: nothing; a read, it creates no key.
-- Returns: {where, score, row}: `where` is 'active' | 'pending' | 'delayed' | 'dead' |
-- 'completed' | '' (a held or failed parent is in no set; its row says which), score is the
-- job's score there (a deadline, a due or finish time in ms) or false, row is the flat HGETALL
-- of the row ({} if none, e.g. a plain job completed with keep_completed=False).
local sets = {{KEYS[3], 'active'}, {KEYS[2], 'pending'}, {KEYS[4], 'delayed'},
  {KEYS[5], 'dead'}, {KEYS[6], 'completed'}}
for _, s in ipairs(sets) do
  local score = redis.call('ZSCORE', s[1], ARGV[1])
  if score then return {s[2], score, redis.call('HGETALL', KEYS[1])} end
end
return {'', false, redis.call('HGETALL', KEYS[1])}
