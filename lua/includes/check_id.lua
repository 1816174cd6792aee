-- check_id(id): refuse an id that is not 'JOB-' plus a safe tail (EMQKIND).
-- The host refuses the same ids first; this is the server's own guard, so a client that
-- skips the host check still cannot write a key that breaks the keyspace grammar. The class
-- spells its ranges out: '%w' costs a C call per character, and every id of every add pays it.
-- Owner of what it writes: nothing - a pure check; it creates no key.
local function check_id(id)
  if type(id) ~= 'string' or #id > 204 or not string.match(id, '^JOB%-[a-zA-Z0-9._/@+=~#-]+$') then
    return redis.error_reply('EMQKIND job id must be JOB- plus a safe tail: ' .. tostring(id))
  end
  return nil
end
