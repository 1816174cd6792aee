-- inspect: a read; one job's row and where it stands, as one consistent snapshot.
--
-- KEYS[1] row  KEYS[2] pending  KEYS[3] active  KEYS[4] delayed  KEYS[5] dead
-- ARGV[1] id
-- Returns: {where, row} where `where` is 'pending' | 'active' | 'delayed' | 'dead' | ''
-- (a held or finished job is in no set) and row is the flat HGETALL of the row ({} if none).
local where = ''
if redis.call('ZSCORE', KEYS[3], ARGV[1]) then where = 'active'
elseif redis.call('ZSCORE', KEYS[2], ARGV[1]) then where = 'pending'
elseif redis.call('ZSCORE', KEYS[4], ARGV[1]) then where = 'delayed'
elseif redis.call('ZSCORE', KEYS[5], ARGV[1]) then where = 'dead' end
return {where, redis.call('HGETALL', KEYS[1])}
