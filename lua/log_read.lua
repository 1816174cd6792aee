#!lua flags=no-writes
-- log_read: one page of a flow's settle log after a cursor, with the values and the parent's
-- state read in the same step (what iter_results follows).
--
-- KEYS[1] row        hash    the parent's row (state, error or a cancel's reason, log)
-- KEYS[2] log        stream  the settle log (settle_current.lua writes it: field = the child's
--                            kind 'c' | 'i' | 'f', value = its id, '.<rest>' for an id
--                            '<parent>.<rest>')
-- KEYS[3] processed  hash    child id -> result (the values of the 'c' entries)
-- ARGV[1] cursor     the id of the last entry the reader consumed ('0-0' from the start)
-- ARGV[2] count      at most this many entries
-- ARGV[3] parent     the parent's id (what a '.<rest>' entry is short for)
--
-- Steps: XRANGE the entries after the cursor, one HMGET of :processed for the completed ones,
-- one HMGET of the row - atomically, so a state that says released with no entry after the
-- cursor means the reader has seen every child (the step that releases a parent logs the child
-- that released it). Writes nothing.
-- Full server: runs (no-writes): it only reads.
-- Owner of what it writes: it creates no key (reads only).
-- Returns: {state | false, error (a cancelled flow: its reason) | false, log flag | false,
-- entries}, entries a flat list of
-- 4 values per entry: entry id, kind, child id (in full), value (false for the non-'c' kinds: deaths carry
-- no result to yield).
local row = redis.call('HMGET', KEYS[1], 'state', 'error', 'log', 'reason')
local found = redis.call('XRANGE', KEYS[2], '(' .. ARGV[1], '+', 'COUNT', tonumber(ARGV[2]))
local out, done = {}, {}
for i, entry in ipairs(found) do
  local fields = entry[2]
  if string.byte(fields[2], 1) == 46 then fields[2] = ARGV[3] .. fields[2] end  -- '.<rest>'
  out[#out + 1] = entry[1]; out[#out + 1] = fields[1]; out[#out + 1] = fields[2]
  out[#out + 1] = false
  if fields[1] == 'c' then done[#done + 1] = i end
end
if #done > 0 then
  local ids = {}
  for j, i in ipairs(done) do ids[j] = found[i][2][2] end
  local values = redis.call('HMGET', KEYS[3], unpack(ids))
  for j, i in ipairs(done) do out[4 * i] = values[j] end
end
return {row[1] or false, row[2] or row[4] or false, row[3] or false, out}
