#!lua flags=no-writes
-- flow_snapshot: a read; the counts of one flow parent, as one consistent snapshot.
-- @include queue_keys
--
-- KEYS[1..15] the queue's keys (includes/queue_keys.lua). Used here: completed (read: a
--             released parent that ran)
-- KEYS[16] row  KEYS[17] dependencies  KEYS[18] processed  KEYS[19] unsuccessful
-- KEYS[20] failed  the parent's keys
-- ARGV[1] the parent id
-- Full server: runs (no-writes): it only reads.
-- Owner of what it writes: nothing; a read, it creates no key.
-- Returns: {state or false, total or false, dependencies or false, |processed|,
--           |unsuccessful|, |failed|, error (a cancelled flow: its reason) or false, repairs,
--           allow (a success threshold's allowance, hold.lua) or false, cap (max_running,
--           hold.lua) or false};
--           state is
--           'completed' once the released
--           parent ran, else the row's: 'held' | 'pending' (released) | 'failed' | 'dead'.
local q = queue_keys(KEYS)
local row = redis.call('HMGET', KEYS[16], 'state', 'total', 'error', 'reason', 'repairs', 'allow',
  'cap')
local state = row[1]
if state and redis.call('ZSCORE', q.completed, ARGV[1]) then state = 'completed' end
return {state, row[2], redis.call('GET', KEYS[17]), redis.call('HLEN', KEYS[18]),
  redis.call('HLEN', KEYS[19]), redis.call('HLEN', KEYS[20]), row[3] or row[4], row[5] or '0',
  row[6] or false, row[7] or false}
