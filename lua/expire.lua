#!lua flags=allow-oom
-- expire: step 2 of a queue's retention sweep: forget what retain.lua picked, re-checked here.
-- @include now_ms
-- @include drop_node
-- @include queue_keys
--
-- KEYS[1..15] the queue's keys (includes/queue_keys.lua). Used here: completed, dead and the
--             five flows_* indexes (the swept entries go), and flows_completed (last key)
-- KEYS[16] config  hash  this queue's retention settings  KEYS[17] sweep:lease  string
-- KEYS[17+8(i-1)+1 .. +8]  candidate i: row, dependencies, processed, unsuccessful, failed,
--                         explicit, repair, log (a flow node's keys; a plain job has only the row)
-- last key flows_completed  zset  worker-run roots that completed (an expiring root's entry
--          goes; see complete.lua)
-- ARGV[1] pump  ARGV[2..15] the defaults, as in retain.lua
-- ARGV[14+2i] ARGV[15+2i]  candidate i: its index ('c' completed, 'd' dead, 'f' flows:failed,
--   'x' flows:closed, 'u' flows:released past the unclosed retention, 'k' flows:cancelled),
--   its id
--
-- Steps: nothing unless this Pump holds the sweep lease. Per candidate, re-checked (still in
-- that index, still past its age or beyond its count):
-- * no row: a plain job completed with keep_completed off - drop the index entry;
-- * a row with a parent (a flow child, or an inner node): the row belongs to its flow, which
--   deletes it when the flow expires - only the index entry goes;
-- * a root flow parent: the flow expires as a unit - its row, counter, records, explicit
--   record and index entries go here, and the reply names its children's queues so the host
--   deletes their rows on their own slots (forget.lua). A failed root whose children are
--   not all settled yet (some still run) waits: it is re-checked a minute later (not a
--   tipped threshold flow whose follow-up ran: its rows `stopped` = `tipped`, nothing runs);
-- * a plain job: its row goes.
-- Never touched: held roots (in no index swept here), pending or leased jobs (ditto).
-- Full server: runs (allow-oom): it deletes rows and index entries; a re-scored flows:failed entry
--  stays in place.
-- Owner of what it writes: it creates nothing: it deletes (a failed root still running children
-- only gets a later score in flows:failed).
-- Returns: {swept, {dropped root: {id, total, child queues, {explicit id, queue, ...}, refs}}}.
local q = queue_keys(KEYS)
if redis.call('GET', KEYS[17]) ~= ARGV[1] then return {0, {}} end
local names = {'completed_age', 'completed_count', 'dead_age', 'dead_count', 'failed_age',
  'failed_count', 'closed_age', 'closed_count', 'unclosed_age', 'unclosed_count',
  'cancelled_age', 'cancelled_count'}
local conf = redis.call('HMGET', KEYS[16], unpack(names))
local now = now_ms()
local index = {c = {q.completed, 1}, d = {q.dead, 3}, f = {q.flows_failed, 5},
  x = {q.flows_closed, 7}, u = {q.flows_released, 9}, k = {q.flows_cancelled, 11}}
local all = {q.completed, q.dead, q.flows_held, q.flows_released, q.flows_closed, q.flows_failed,
  q.flows_cancelled, KEYS[#KEYS]}
local function setting(i)
  local v = conf[i] or ARGV[1 + i]
  if v == '-1' or v == '' then return nil end
  return tonumber(v)
end
local function due(key, slot, id)
  local score = redis.call('ZSCORE', key, id)
  if not score then return false end
  local age, count = setting(slot), setting(slot + 1)
  if age and tonumber(score) <= now - age then return true end
  if count then
    local over = redis.call('ZCARD', key) - count
    if over > 0 and redis.call('ZRANK', key, id) < over then return true end
  end
  return false
end
local swept, roots = 0, {}
local n = (#ARGV - 15) / 2
for i = 1, n do
  local code, id = ARGV[14 + 2 * i], ARGV[15 + 2 * i]
  local k = 17 + (i - 1) * 8
  local nk = {unpack(KEYS, k + 1, k + 8)}
  local ix = index[code]
  if ix and due(ix[1], ix[2], id) then
    local row = redis.call('HMGET', nk[1], 'parent', 'total', 'stopped', 'tipped')
    if row[1] then
      redis.call('ZREM', ix[1], id)
      swept = swept + 1
    elseif row[2] then
      local settled = redis.call('HLEN', nk[3]) + redis.call('HLEN', nk[4]) +
        redis.call('HLEN', nk[5])
      -- a tipped threshold flow whose follow-up ran (stopped.lua) waits for nothing: its
      -- unstarted children were cancelled, its leased ones lost their leases
      local stopped = row[3] and row[3] == row[4]
      if code == 'f' and settled < tonumber(row[2]) and not stopped then
        local age = setting(5)
        if age then redis.call('ZADD', q.flows_failed, now - age + 60000, id) end
      else
        roots[#roots + 1] = drop_node(nk, all, id)
        swept = swept + 1
      end
    else
      redis.call('DEL', nk[1])
      redis.call('ZREM', ix[1], id)
      swept = swept + 1
    end
  end
end
return {swept, roots}
