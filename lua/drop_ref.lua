#!lua flags=allow-oom
-- drop_ref: delete a named flow reference if it still holds `body` (the expired flow's).
--
-- KEYS[1] ref   the reference string
-- ARGV[1] body  what it holds when it points to the expired flow
-- Full server: runs (allow-oom): it deletes a reference and creates none.
-- Owner of what it writes: it creates no key; it deletes the reference (it is its owner).
-- Returns: 1 deleted, 0 it points elsewhere now (or is gone).
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  return 1
end
return 0
