#!lua
-- hold: the first step of adding a flow; hold a parent on its own slot with its counter.
-- @include check_id
-- @include allowance
-- @include now_ms
-- @include queue_keys
--
-- KEYS[1..15] the queue's keys (includes/queue_keys.lua). Used here: flows_held (this queue's
--              index of held root flows: roots only)
-- KEYS[16] row           hash    the parent's row
-- KEYS[17] dependencies  string  the parent's outstanding-child counter
-- KEYS[18] explicit      hash    child id -> queue of the children whose ids were given
-- ARGV[1] id            the parent id
-- ARGV[2] payload       the parent's payload (serialised)
-- ARGV[3] total         N, ALL its children, same-queue and cross-queue together
-- ARGV[4] max_attempts
-- ARGV[5] parent        '' for a root; else the id of this parent's own parent (nested flows)
-- ARGV[6] parent_queue  '' when that parent is in this queue, else its queue
-- ARGV[7] policy        this node's own failure-policy token toward its parent: 'fp' | 'id'
-- ARGV[8] fingerprint   a digest of this parent's children (their queues and ids, in order),
--                       made by the host: a re-add with other children is refused, not merged
-- ARGV[9] timeout_ms    the parent's own handler time limit ('' = the queue's)
-- ARGV[10] barrier      '1': a flow read from outside - released means readable, no worker
--                       ever claims the parent, a reader closes it (roots only); '' otherwise
-- ARGV[11] child queues the distinct queues of its children, space-separated (the flow's
--                       expiry visits them to delete the children's rows)
-- ARGV[12] gen          '' for a first flow; n for a flow that replaced n older ones under this
--                       id (its derived child ids are <id>.g<n>.<i>; settle drops reports of
--                       other generations' children)
-- ARGV[13] allow        '' no success threshold; else how many of its fail-parent children
--                       may die without failing it (N - required; settle_current.lua), then
--                       a space and the threshold as given - a count `<c>` or an exact
--                       fraction `<p>/<q>` - kept as the row's `need` so that spawn.lua sets
--                       the allowance again when the flow grows
-- ARGV[14] max_running  '' = no cap; else K, the cap on this node's leased leaf children
--                       (kept as the row's 'cap': counted on the child queues' slots, by
--                       the gates land.lua fills; a re-add with another cap is refused)
-- ARGV[15] tree digest  '' or (roots of replacing adds) a digest of the whole planned flow,
--                       kept as the row's 'tfp': add_flow(replace=True) compares it on the
--                       host before it decides to converge or to replace
-- ARGV[16] log           '1': keep a settle log (row field `log`; add_flow(stream=True), roots
--                       only): every settle of a child appends to the parent's :log stream in
--                       the step that counts it (settle_current.lua); '' otherwise (a re-add with
--                       the other setting is refused)
-- ARGV[17..] pairs: child id, queue - the children whose ids were given (not derived)
--
-- Steps: a parent that already exists is left exactly as it is (holding never resets a
-- counter: a retried add converges instead of starting over) - provided it is the SAME flow:
-- same parent of its own, same N, same fingerprint, same allowance; otherwise the row is written in state
-- 'held' and the counter set to N, in this one script, so the counter exists before any child
-- can complete; a root enters flows:held. Two different adds racing on one id: one holds, the
-- other is refused here.
-- Full server: refused before it runs (no allow-oom): it may grow memory, so it writes all or
--  nothing.
-- Owner of what it writes: the row (with `allow`, `need`, `tfp` and `log`), the counter, the explicit record and the index entry are
-- removed when the flow expires (expire.lua / forget.lua, by the retention sweep).
-- Returns: 1 held now, 0 already existed (the same flow).
-- Errors: EMQKIND bad id; EMQTAKEN <id> the id is another flow's node or a plain job; EMQFLOW
-- the parent exists with other children or settings; EMQGEN <n> it holds a flow of generation n while the
-- host planned another (the host re-plans once). All three are FlowConflict on the host.
local q = queue_keys(KEYS)
local bad = check_id(ARGV[1])
if bad then return bad end
local row = redis.call('HMGET', KEYS[16], 'total', 'fp', 'parent', 'state', 'gen', 'allow',
  'cap', 'parent_queue', 'log', 'grown', 'need')
local allow, need = string.match(ARGV[13], '^(%S*) ?(%S*)$')
if row[4] == 'replaced' then
  redis.call('DEL', KEYS[16])  -- the tombstone of a replaced flow: this hold takes its place
elseif row[1] then
  -- the same parent of its own: its id AND its queue (a parent of the same id in another
  -- queue is another flow, whose node this one would wait on for ever)
  if (row[3] or '') ~= ARGV[5] or (row[8] or '') ~= ARGV[6] then
    local owner = 'a root flow parent'
    if row[3] then owner = 'a child of ' .. row[3] end
    if row[3] == ARGV[5] then owner = owner .. ' in another queue' end
    return redis.error_reply('EMQTAKEN ' .. ARGV[1] .. ' id ' .. ARGV[1] .. ' is taken by ' .. owner)
  end
  if (row[5] or '') ~= ARGV[12] then  -- the host planned another generation's ids: re-plan
    return redis.error_reply('EMQGEN ' .. (row[5] or '0') .. ' parent ' .. ARGV[1] .. ' is generation ' ..
      (row[5] or '0'))
  end
  -- children spawned at run time (spawn.lua: `grown`) are not the add's: N is what it added
  local added = tonumber(row[1]) - (tonumber(row[10]) or 0)
  if added ~= tonumber(ARGV[3]) then
    return redis.error_reply('EMQFLOW parent ' .. ARGV[1] .. ' exists with ' .. added ..
      ' children, not ' .. ARGV[3])
  end
  if row[2] and row[2] ~= ARGV[8] then
    return redis.error_reply('EMQFLOW parent ' .. ARGV[1] .. ' exists with ' .. row[1] ..
      ' other children (other ids or queues)')
  end
  -- the same allowance over the N added (a grown flow's `allow` moved with its total, so a
  -- row that keeps `need` is compared at N; rows written before `need` existed by `allow`)
  local same = (row[6] or '') == allow
  if row[11] then same = tostring(allowance(row[11], tonumber(ARGV[3]))) == allow end
  if not same then
    local have, want = 'no success threshold', 'one allowing ' .. allow .. ' failures'
    if row[6] then have = 'a success threshold allowing ' .. row[6] .. ' failures' end
    if allow == '' then want = 'none' end
    return redis.error_reply('EMQFLOW parent ' .. ARGV[1] .. ' exists with ' .. have .. ', not ' ..
      want)
  end
  if (row[7] or '') ~= ARGV[14] then
    return redis.error_reply('EMQFLOW parent ' .. ARGV[1] .. ' exists with max_running ' ..
      (row[7] or 'unset') .. ', not ' .. (ARGV[14] ~= '' and ARGV[14] or 'unset'))
  end
  if (row[9] or '') ~= ARGV[16] then
    local have = 'without a settle log (stream=False)'
    if row[9] then have = 'with a settle log (stream=True)' end
    return redis.error_reply('EMQFLOW parent ' .. ARGV[1] .. ' exists ' .. have)
  end
  return 0
elseif redis.call('EXISTS', KEYS[16]) == 1 then
  return redis.error_reply('EMQTAKEN ' .. ARGV[1] .. ' id ' .. ARGV[1] ..
    ' is taken by a job that is not a flow parent')
end
local now = now_ms()
local fields = {'state', 'held', 'payload', ARGV[2], 'total', ARGV[3], 'max_attempts', ARGV[4],
  'created', now, 'fp', ARGV[8], 'cq', ARGV[11]}
if ARGV[5] ~= '' then
  fields[#fields + 1] = 'parent'; fields[#fields + 1] = ARGV[5]
  fields[#fields + 1] = 'parent_policy'; fields[#fields + 1] = ARGV[7]
  if ARGV[6] ~= '' then fields[#fields + 1] = 'parent_queue'; fields[#fields + 1] = ARGV[6] end
else
  redis.call('ZADD', q.flows_held, now, ARGV[1])
  if ARGV[10] == '1' then fields[#fields + 1] = 'barrier'; fields[#fields + 1] = '1' end
end
if ARGV[9] ~= '' then fields[#fields + 1] = 'timeout'; fields[#fields + 1] = ARGV[9] end
-- packed for the claim's rows read, as land.lua writes it (a worker claims a worker-run parent;
-- a sub-flow's parent has no gate): includes/run.lua
local packed = ARGV[4] .. ' 0 0 ' .. (ARGV[9] ~= '' and ARGV[9] or '-') .. ' ' .. now
if ARGV[5] ~= '' then packed = packed .. ' ' .. ARGV[7] .. ' 0 ' .. ARGV[6] end
fields[#fields + 1] = 'run'; fields[#fields + 1] = packed
if ARGV[12] ~= '' then fields[#fields + 1] = 'gen'; fields[#fields + 1] = ARGV[12] end
if allow ~= '' then fields[#fields + 1] = 'allow'; fields[#fields + 1] = allow end
if need ~= '' then fields[#fields + 1] = 'need'; fields[#fields + 1] = need end
if ARGV[14] ~= '' then fields[#fields + 1] = 'cap'; fields[#fields + 1] = ARGV[14] end
if ARGV[15] ~= '' then fields[#fields + 1] = 'tfp'; fields[#fields + 1] = ARGV[15] end
if ARGV[16] ~= '' then fields[#fields + 1] = 'log'; fields[#fields + 1] = '1' end
redis.call('HSET', KEYS[16], unpack(fields))
redis.call('SET', KEYS[17], ARGV[3])
-- unpack() is bounded by the Lua stack: write the explicit record in slices
for i = 17, #ARGV, 1000 do
  redis.call('HSET', KEYS[18], unpack(ARGV, i, math.min(i + 999, #ARGV)))
end
return 1
