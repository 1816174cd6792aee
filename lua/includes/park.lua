-- park(q, stem, from, to, ids, gk): take children of a tipped threshold flow out of reach of the
-- claims of ONE queue (q = queue_keys.lua), without reading their rows: every candidate id that
-- is pending moves to delayed with the score +inf, and one that waits in delayed for a retry
-- gets +inf there. The candidates are the derived ids stem .. i for i in [from, to) (none when
-- from >= to) and the ids of the list `ids`. A claim never reaches a score of +inf (claim.lua
-- and promote.lua take delayed jobs due by now), so a parked child cannot start, and it is
-- still in a set the cancel walk sweeps: cancel_children.lua takes it out of delayed and marks
-- its row 'cancelled' (lifecycle.stop_unstarted runs the walk after the park). Ids that are
-- not pending or delayed (leased, finished, absent) are left as they are. With `gk` (the
-- flow's cap gate in this queue, includes/gate.lua) the gate is marked off, as the cancel walk
-- does, so a child that settles meanwhile admits no waiting one into pending.
-- Only ids that surely are the flow's children may be given: derived ids of a flow without
-- explicit ids (landing refuses a derived id that another job holds: EMQTAKEN), explicit ids
-- from the flow's :explicit record (the add refused any taken by another). A caller bounds
-- the work: to - from + #ids ids per call (lifecycle.PARK_CHUNK).
-- Owner of what it writes: the parked delayed entries are removed by cancel_children.lua in
-- the same follow-up (or by requeue through a repair, after that follow-up finished); the
-- gate's 'off' goes with the gate (forget.lua), or a repair takes it away (requeue.lua).
-- Returns: how many children were parked.
local function park(q, stem, from, to, ids, gk)
  local parked = 0
  if gk and redis.call('EXISTS', gk[2]) == 1 then redis.call('HSET', gk[2], 'off', '1') end
  local function slice(batch)
    if #batch == 0 then return end
    local p = redis.call('ZMSCORE', q.pending, unpack(batch))
    local d = redis.call('ZMSCORE', q.delayed, unpack(batch))
    local gone, moved = {}, {}
    for i = 1, #batch do
      if p[i] then gone[#gone + 1] = batch[i] end
      if p[i] or (d[i] and d[i] ~= 'inf') then
        moved[#moved + 1] = 'inf'; moved[#moved + 1] = batch[i]
      end
    end
    if #gone > 0 then redis.call('ZREM', q.pending, unpack(gone)) end
    if #moved > 0 then redis.call('ZADD', q.delayed, unpack(moved)) end
    parked = parked + #moved / 2
  end
  local batch = {}
  for i = from, to - 1 do
    batch[#batch + 1] = stem .. i
    if #batch == 1000 then slice(batch); batch = {} end
  end
  for i = 1, #ids do
    batch[#batch + 1] = ids[i]
    if #batch == 1000 then slice(batch); batch = {} end
  end
  slice(batch)
  return parked
end
