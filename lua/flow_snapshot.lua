-- flow_snapshot: a read; the counts of one flow parent, as one consistent snapshot.
--
-- KEYS[1] row  KEYS[2] dependencies  KEYS[3] processed  KEYS[4] unsuccessful  KEYS[5] failed
-- KEYS[6] completed  the parent queue's completed set
-- ARGV[1] the parent id
-- Owner of what it writes: nothing; a read, it creates no key.
-- Returns: {state or false, total or false, dependencies or false, |processed|,
--           |unsuccessful|, |failed|, error (a cancelled flow: its reason) or false, repairs};
--           state is
--           'completed' once the released
--           parent ran, else the row's: 'held' | 'pending' (released) | 'failed' | 'dead'.
local row = redis.call('HMGET', KEYS[1], 'state', 'total', 'error', 'reason', 'repairs')
local state = row[1]
if state and redis.call('ZSCORE', KEYS[6], ARGV[1]) then state = 'completed' end
return {state, row[2], redis.call('GET', KEYS[2]), redis.call('HLEN', KEYS[3]),
  redis.call('HLEN', KEYS[4]), redis.call('HLEN', KEYS[5]), row[3] or row[4], row[5] or '0'}
