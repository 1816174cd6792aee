-- drop_node(nk, idx, id): delete one flow node (a root or an inner parent) whose flow expires.
--   nk  = {row, dependencies, processed, unsuccessful, failed, explicit, repair, log} keys of the
--         node (log: the settle log of a flow added with stream=True; this is its owner)
--   idx = the index zsets of its queue it may be listed in (completed, dead, flows:*)
-- Returns what the host needs to reach the node's children on their slots:
-- {id, total, child queues, {explicit child id, queue, ...}, refs, gen}. The caller has checked
-- that the node's flow may expire (no held parent, no unsettled child).
-- Owner of what it writes: nothing is created; it deletes the node's keys, the settle log too.
local function drop_node(nk, idx, id)
  local row = redis.call('HMGET', nk[1], 'total', 'cq', 'refs', 'gen')
  local explicit = redis.call('HGETALL', nk[6])
  redis.call('DEL', nk[1], nk[2], nk[3], nk[4], nk[5], nk[6], nk[7], nk[8])
  for i = 1, #idx do redis.call('ZREM', idx[i], id) end
  return {id, row[1] or '0', row[2] or '', explicit, row[3] or '', row[4] or ''}
end
