-- forget: step 3 of a flow's expiry, on one child queue's slot: delete the rows of one
-- expired node's children that live in this queue.
--
-- KEYS[1] completed  KEYS[2] dead   this queue's index zsets (a child's entries go too)
-- KEYS[2+i]          the row of candidate child i
-- ARGV[1] parent     the expired node's id
-- then the candidate child ids (the host lists the node's derived ids <parent>.<index> and
--   its explicit ids of this queue: a candidate that has no row here is skipped)
--
-- Steps: a candidate whose row names `parent` as its parent is deleted with its index
-- entries (one DEL and one ZREM per index for the batch: one read per child, three writes per
-- call) - unless it is a parent itself (an inner node): that one is named in the reply and
-- the host drops it with all its keys (drop.lua), then visits ITS children. A row that
-- belongs to anything else is never touched.
-- Owner of what it writes: it creates no key; it deletes rows and their index entries.
-- Returns: {deleted, {inner node ids}}.
local rows, ids, inner = {}, {}, {}
for i = 2, #ARGV do
  local up = redis.call('HMGET', KEYS[1 + i], 'parent', 'total')
  if up[1] == ARGV[1] then
    if up[2] then
      inner[#inner + 1] = ARGV[i]
    else
      rows[#rows + 1] = KEYS[1 + i]; ids[#ids + 1] = ARGV[i]
    end
  end
end
-- one DEL and one ZREM per index for the whole batch (at most 500 ids: within unpack's bound)
if #rows > 0 then
  redis.call('DEL', unpack(rows))
  redis.call('ZREM', KEYS[1], unpack(ids))
  redis.call('ZREM', KEYS[2], unpack(ids))
end
return {#rows, inner}
