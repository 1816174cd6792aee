-- drop: delete an inner node of an expiring flow with all its keys (forget.lua named it).
-- @include drop_node
--
-- KEYS[1..7] the node's row, dependencies, processed, unsuccessful, failed, explicit, repair
-- KEYS[8] completed  KEYS[9] dead  this queue's job indexes (the node's entries go too)
-- ARGV[1] id  ARGV[2] parent  the node's own parent (re-checked: only that flow's node goes)
-- Owner of what it writes: it creates no key; it deletes the node's keys (it is their owner).
-- Returns: the node's {id, total, child queues, {explicit id, queue, ...}, refs}, so the host
-- visits its children; {} when the row is not that parent's node.
if redis.call('HGET', KEYS[1], 'parent') ~= ARGV[2] then return {} end
return drop_node({KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7]},
  {KEYS[8], KEYS[9]}, ARGV[1])
