#!lua flags=allow-oom
-- drop: delete an inner node of an expiring flow with all its keys (forget.lua named it).
-- @include drop_node
-- @include queue_keys
--
-- KEYS[1..15] the queue's keys (includes/queue_keys.lua). Used here: completed and dead (the
--             node's entries go too)
-- KEYS[16..23] the node's row, dependencies, processed, unsuccessful, failed, explicit, repair,
--               log
-- ARGV[1] id  ARGV[2] parent  the node's own parent (re-checked: only that flow's node goes)
-- Full server: runs (allow-oom): it deletes a node's keys and creates none.
-- Owner of what it writes: it creates no key; it deletes the node's keys (it is their owner).
-- Returns: the node's {id, total, child queues, {explicit id, queue, ...}, refs}, so the host
-- visits its children; {} when the row is not that parent's node.
local q = queue_keys(KEYS)
if redis.call('HGET', KEYS[16], 'parent') ~= ARGV[2] then return {} end
return drop_node({unpack(KEYS, 16, 23)}, {q.completed, q.dead}, ARGV[1])
