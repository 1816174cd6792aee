-- flow_node(row_key, id, parent, verb, fields): read a flow node's row for a lifecycle script
-- (close, cancel, repair) and refuse what is not the node the caller named. Reads 'state',
-- 'total', 'parent', 'payload' and then `fields` (extra names) with one HMGET.
--   parent = '' when the caller names a root; else the id of the node's own parent
--   verb   = what the caller does ('close', 'cancel', 'repair'), for the error text
-- Returns: the row values {state, total, parent, payload, fields...}, or an error reply:
-- EMQNOJOB no such row; EMQFLOW a plain job, or a node that is not the one named (a root
-- was named and this is a sub-flow: act on its root; a sub-flow was named and this is not
-- one of that parent).
local function flow_node(row_key, id, parent, verb, fields)
  local row = redis.call('HMGET', row_key, 'state', 'total', 'parent', 'payload', unpack(fields))
  if not row[1] and not row[4] then
    return nil, redis.error_reply('EMQNOJOB no flow parent ' .. id)
  end
  if not row[2] then
    return nil, redis.error_reply('EMQFLOW ' .. id .. ' is a job, not a flow parent')
  end
  if (row[3] or '') ~= parent then
    local where = 'is a node of the flow of ' .. tostring(row[3]) .. ': ' .. verb .. ' the root'
    if not row[3] then where = 'is a root, not a node of ' .. parent end
    return nil, redis.error_reply('EMQFLOW ' .. id .. ' ' .. where)
  end
  return row, nil
end
