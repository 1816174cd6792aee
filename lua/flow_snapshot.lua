-- flow_snapshot: a read; the counts of one flow parent, as one consistent snapshot.
--
-- KEYS[1] row  KEYS[2] dependencies  KEYS[3] processed  KEYS[4] unsuccessful  KEYS[5] failed
-- Returns: {state or false, total or false, dependencies or false, |processed|,
--           |unsuccessful|, |failed|, error or false}
local row = redis.call('HMGET', KEYS[1], 'state', 'total', 'error')
return {row[1], row[2], redis.call('GET', KEYS[2]), redis.call('HLEN', KEYS[3]),
  redis.call('HLEN', KEYS[4]), redis.call('HLEN', KEYS[5]), row[3]}
