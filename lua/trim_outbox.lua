#!lua flags=allow-oom
-- trim_outbox: remove exactly the delivered prefix of an outbox page, and age a head that
-- does not deliver, moving it to the poison list after `max_tries`.
-- @include now_ms
-- @include queue_keys
--
-- KEYS[1..15] the queue's keys (includes/queue_keys.lua). Used here: outbox (the delivered
--             prefix goes)
-- KEYS[16] lease   string  the Pump lease of this outbox
-- KEYS[17] head    hash    the ageing record: entry, tries
-- KEYS[18] poison  list    signals moved aside, each '<ms> <reason>\n' .. entry (the time lets
--                         the retention sweep drop old entries: retain.lua owns them)
-- ARGV[1] pump       this Pump's id
-- ARGV[2] delivered  how many entries from the head were delivered (a contiguous prefix)
-- ARGV[3] first      the entry that was at the head when the page was read
-- ARGV[4] blocked    the first entry that did not deliver ('' when the whole page delivered)
-- ARGV[5] max_tries  how many failed deliveries a head gets before it is poisoned
-- ARGV[6] reason     why `blocked` did not deliver
--
-- Steps: nothing happens unless this Pump still holds the lease AND the head is still `first`
-- (so a Pump that lost its lease, or a page another Pump already trimmed, removes nothing:
-- the worst case is a redelivery, which is harmless). Then LTRIM the delivered prefix. If a
-- blocked entry is now at the head, count a try; at max_tries move it to poison with its
-- reason, so one bad signal cannot stall the queue behind it.
-- Full server: runs (allow-oom): it trims delivered signals; a poisoned one moves to the poison
--  list with a stamp, a few bytes less than the signals trimmed.
-- Owner of what it writes: the head record is deleted when the head delivers or is poisoned;
-- poison entries are dropped by the poison retention (retain.lua, by age and count).
-- Returns: {trimmed, poisoned}; {-1, 0} when the lease or the head did not match.
local q = queue_keys(KEYS)
if redis.call('GET', KEYS[16]) ~= ARGV[1] then return {-1, 0} end
local delivered = tonumber(ARGV[2])
if redis.call('LINDEX', q.outbox, 0) ~= ARGV[3] then return {-1, 0} end
if delivered > 0 then redis.call('LTRIM', q.outbox, delivered, -1) end
local poisoned = 0
local blocked = ARGV[4]
if blocked ~= '' and redis.call('LINDEX', q.outbox, 0) == blocked then
  local tries = 1
  if redis.call('HGET', KEYS[17], 'entry') == blocked then
    tries = redis.call('HINCRBY', KEYS[17], 'tries', 1)
  else
    redis.call('HSET', KEYS[17], 'entry', blocked, 'tries', 1)
  end
  if tries >= tonumber(ARGV[5]) then
    redis.call('LPOP', q.outbox)
    local reason = string.gsub(ARGV[6], '\n', ' ')
    redis.call('RPUSH', KEYS[18], now_ms() .. ' ' .. reason .. '\n' .. blocked)
    redis.call('DEL', KEYS[17])
    poisoned = 1
  end
elseif delivered > 0 then
  redis.call('DEL', KEYS[17])
end
return {delivered, poisoned}
