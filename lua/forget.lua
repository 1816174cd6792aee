#!lua flags=allow-oom
-- forget: step 3 of a flow's expiry, on one child queue's slot: delete the rows of one
-- expired node's children that live in this queue.
-- @include queue_keys
--
-- KEYS[1..15] the queue's keys (includes/queue_keys.lua). Used here: completed and dead (a
--             child's entries go too)
-- KEYS[16] KEYS[17]  the gate (waiting, cap) of the node's children in this queue
--             (includes/gate.lua; absent keys when the node had no cap): deleted here
-- KEYS[17+j]  the row of candidate child j (ARGV[1+j])
-- ARGV[1] parent     the expired node's id
-- then the candidate child ids (the host lists the node's derived ids <parent>.<index> and
--   its explicit ids of this queue: a candidate that has no row here is skipped)
--
-- Steps: a candidate whose row names `parent` as its parent is deleted with its index
-- entries (one DEL and one ZREM per index for the batch: one read per child, three writes per
-- call) - unless it is a parent itself (an inner node): that one is named in the reply and
-- the host drops it with all its keys (drop.lua), then visits ITS children. A row that
-- belongs to anything else is never touched.
-- Full server: runs (allow-oom): it deletes rows and index entries and creates none.
-- Owner of what it writes: it creates no key; it deletes rows and their index entries, and the
-- node's gate in this queue (its owner).
-- Returns: {deleted, {inner node ids}}.
local q = queue_keys(KEYS)
local rows, ids, inner = {}, {}, {}
redis.call('DEL', KEYS[16], KEYS[17])
for j = 1, #ARGV - 1 do
  local row = KEYS[17 + j]
  local up = redis.call('HMGET', row, 'parent', 'total')
  if up[1] == ARGV[1] then
    if up[2] then
      inner[#inner + 1] = ARGV[1 + j]
    else
      rows[#rows + 1] = row; ids[#ids + 1] = ARGV[1 + j]
    end
  end
end
-- one DEL and one ZREM per index for the whole batch (at most 500 ids: within unpack's bound)
if #rows > 0 then
  redis.call('DEL', unpack(rows))
  redis.call('ZREM', q.completed, unpack(ids))
  redis.call('ZREM', q.dead, unpack(ids))
end
return {#rows, inner}
