#!lua
-- note_ref: record on a root's row that a named reference points to it, so the reference is
-- deleted with the flow when it expires (expire.lua returns the names; the host deletes each
-- one that still points to this flow, drop_ref.lua).
--
-- KEYS[1] row   the root's row
-- ARGV[1] name  the reference's name (no whitespace: REF_NAME_RE)
-- Steps: nothing when the row does not exist (a reference to no flow owns nothing here).
-- Full server: refused before it runs (no allow-oom): it may grow memory, so it writes all or
--  nothing.
-- Owner of what it writes: the refs field goes with the root's row; the named reference it
-- lists is deleted when the flow expires (drop_ref.lua). A reference saved for no flow
-- (note_ref answers 0) has no owner: save_ref callers (the Dagster IO manager) save only refs
-- to flows they added.
-- Returns: 1 recorded (or already), 0 no such row.
local refs = redis.call('HGET', KEYS[1], 'refs')
if not refs then
  if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
  redis.call('HSET', KEYS[1], 'refs', ARGV[1])
  return 1
end
for name in string.gmatch(refs, '%S+') do
  if name == ARGV[1] then return 1 end
end
redis.call('HSET', KEYS[1], 'refs', refs .. ' ' .. ARGV[1])
return 1
