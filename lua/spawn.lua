#!lua
-- spawn: grow a flow by children a running child spawns - its siblings, on the parent's slot,
-- or (own mode) its own children, on its own slot - before any of them lands.
-- @include check_id
-- @include allowance
--
-- KEYS[1] row           hash    the parent's row (state, total, cap, cq, grown, need); in own
--                               mode the spawner's own row
-- KEYS[2] dependencies  string  that node's outstanding-child counter
-- KEYS[3] explicit      hash    child id -> queue: the spawned children are recorded here, so
--                               cancel, park, repair and the expiry reach them as they reach
--                               children with ids of their own
-- KEYS[4] leases        hash    own mode only: the spawner queue's leases (its token is checked)
-- ARGV[1] spawner       the id of the child that spawns (for the error texts)
-- ARGV[2] bound         how many children the flow may have in all (N + everything spawned)
-- ARGV[3] own           '' siblings; else the spawner's lease token: own mode
-- ARGV[4] stem upto     the ids' stem ('<spawner>.s', '.r' or '.k') and the index after this
--                       call's last id: the row keeps the largest as 'n:<stem>', so the run
--                       that settles, having spawned fewer than an earlier run counted, can
--                       settle the rest as never landed (unspawn.lua). An id voided so (a
--                       'v:<id>' field) is recorded already: spawning it again counts nothing
-- ARGV[5..] pairs: child id, queue - the spawned children
--
-- Steps (siblings): refuse (nothing written) a parent that is not held (released, failed,
-- cancelled: a flow that no longer waits cannot grow), a capped parent asked to grow into a queue its cap
-- has no share in, and a growth past the bound. Then each child not recorded yet is recorded
-- with HSETNX, and the counter and the row's `total` grow by the number recorded now - in this
-- one script, before the host lands them (land.lua) on their own slots, so no spawned child
-- can settle before it is counted, and the spawner, still unsettled while its handler runs,
-- keeps the counter above 0 until then: no release is premature. A re-run of the spawner that
-- spawns the same ids counts nothing twice. `grown` (how many of `total` came by spawns) lets a
-- retried add of the original flow still converge (hold.lua compares total - grown with N).
-- A success threshold (`need`, as hold.lua kept it) is applied to the grown total: `allow`
-- becomes allowance(need, total) (includes/allowance.lua); a parent with an `allow` but no
-- `need` (written before it existed) keeps its allowance.
-- Own mode: the spawner becomes an inner node of its flow while its handler runs - refused
-- (nothing written) when the token is no longer its lease (EMQLEASE), and when the row is a
-- node already past its first run (state 'pending' once its own children settled: a resumed
-- run does not grow them again; any other state but 'active'). The first own spawn writes
-- `state` = 'active', which settle.lua needs to count reports at all; a report of a child
-- that settles while the spawner runs is counted and releases nothing (only a 'held' node is
-- released): await.lua, when the handler returns, makes it 'held', or 'pending' (released)
-- if they all settled meanwhile, or 'failed'. Own children have no cap and no threshold.
-- Full server: refused before it runs (no allow-oom): it may grow memory, so it writes all or
--  nothing.
-- Owner of what it writes: the row's fields, the counter and the explicit record go with the
-- flow's expiry (expire.lua / drop_node.lua, which reach an inner node by its `total`), as
-- hold.lua's.
-- Returns: {flags, cap or false}: flags, per child, 1 recorded now (no earlier spawn counted it,
-- so no earlier landing wrote its row: the host lands it with land.lua's check '0') or 0
-- recorded before (a re-run: land.lua reads its row); cap is the parent's max_running (the
-- host then lands the children through their queue's gate).
-- Errors: EMQKIND bad id; EMQNOJOB no such parent; EMQFLOW the parent is not held, or not a
-- flow parent (own mode: the spawner already ran as their parent); EMQARG the bound, or a
-- capped parent's queue without a share; EMQLEASE (own mode) the spawner's lease is gone.
local own = ARGV[3] ~= ''
local first = 5  -- the first pair's index in ARGV
local stem, upto = string.match(ARGV[4], '^(%S+) (%d+)$')
if own then
  if redis.call('HGET', KEYS[4], ARGV[1]) ~= ARGV[3] then
    return redis.error_reply('EMQLEASE job ' .. ARGV[1] ..
      ' no longer holds its lease: nothing spawned')
  end
  local state = redis.call('HGET', KEYS[1], 'state')
  if state and state ~= 'active' then
    local what = 'its own children have settled and it runs as their parent'
    if state ~= 'pending' then what = 'it is ' .. state end
    return redis.error_reply('EMQFLOW job ' .. ARGV[1] .. ': ' .. what ..
      ': nothing spawned (own children are spawned by its first run)')
  end
end
local row = redis.call('HMGET', KEYS[1], 'state', 'total', 'cap', 'cq', 'grown', 'need',
  'n:' .. stem)
if not row[1] and not own then
  return redis.error_reply('EMQNOJOB no flow parent for ' .. ARGV[1] .. ' to spawn under')
end
local fresh_node = false  -- own mode: its first own spawn (written below, after every check)
if own then
  fresh_node = row[1] ~= 'active'
  row[1], row[2] = 'held', row[2] or '0'  -- checked above: its first run ('active' or no state)
end
if not row[2] then
  return redis.error_reply('EMQFLOW the parent of ' .. ARGV[1] .. ' is not a flow parent')
end
if row[1] ~= 'held' then
  local what = row[1]
  if what == 'pending' then what = 'released (its parent is queued for a worker)' end
  return redis.error_reply('EMQFLOW the flow of ' .. ARGV[1] .. ' is ' .. what ..
    ': nothing spawned (only a held flow grows)')
end
local queues, cq = {}, row[4] or ''
for name in string.gmatch(cq, '%S+') do queues[name] = true end
local ids = {}
for i = first, #ARGV, 2 do
  local bad = check_id(ARGV[i])
  if bad then return bad end
  ids[#ids + 1] = ARGV[i]
end
local known = {}  -- one HMGET per 1,000 ids, not a read per child
for i = 1, #ids, 1000 do
  local got = redis.call('HMGET', KEYS[3], unpack(ids, i, math.min(i + 999, #ids)))
  for j = 1, #got do known[i + j - 1] = got[j] end
end
local fresh, flags, grown_cq = {}, {}, {}
for j = 1, #ids do
  local i = first - 2 + 2 * j
  flags[j] = 0
  if not known[j] then
    flags[j] = 1
    fresh[#fresh + 1] = ARGV[i]; fresh[#fresh + 1] = ARGV[i + 1]
    local q = ARGV[i + 1]
    if not queues[q] then
      if row[3] then
        return redis.error_reply('EMQARG flow of ' .. ARGV[1] .. ' has max_running ' .. row[3] ..
          ' shared over its queues (' .. cq .. '): a spawned child cannot run in ' .. q)
      end
      queues[q] = true; grown_cq[#grown_cq + 1] = q
    end
  end
end
local n = #fresh / 2
local total = tonumber(row[2]) + n
if total > tonumber(ARGV[2]) then
  return redis.error_reply('EMQARG flow of ' .. ARGV[1] .. ' would grow to ' .. total ..
    ' children; the bound is ' .. ARGV[2])
end
if n > 0 then
  for i = 1, #fresh, 1000 do  -- unpack() is bounded by the Lua stack
    redis.call('HSET', KEYS[3], unpack(fresh, i, math.min(i + 999, #fresh)))
  end
  redis.call('INCRBY', KEYS[2], n)
  local fields = {'total', total, 'grown', (tonumber(row[5]) or 0) + n}
  if fresh_node then fields[#fields + 1] = 'state'; fields[#fields + 1] = 'active' end
  if row[6] then
    fields[#fields + 1] = 'allow'; fields[#fields + 1] = allowance(row[6], total)
  end
  if #grown_cq > 0 then
    fields[#fields + 1] = 'cq'
    fields[#fields + 1] = (cq ~= '' and cq .. ' ' or '') .. table.concat(grown_cq, ' ')
  end
  redis.call('HSET', KEYS[1], unpack(fields))
end
if tonumber(upto) > tonumber(row[7] or '0') then redis.call('HSET', KEYS[1], 'n:' .. stem, upto) end
return {flags, row[3] or false}
