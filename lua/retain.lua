#!lua flags=allow-oom
-- retain: step 1 of a queue's retention sweep: pick what is due, trim the poison list.
-- @include now_ms
-- @include queue_keys
--
-- KEYS[1..15] the queue's keys (includes/queue_keys.lua). Used here: completed, dead,
--             flows_failed, flows_closed, flows_released (barrier flows nobody closed) and
--             flows_cancelled: the indexes read (by score: the time each entered)
-- KEYS[16] config       hash    this queue's retention settings (absent: ARGV defaults)
-- KEYS[17] sweep:lease  string  which Pump sweeps this queue now
-- KEYS[18] poison       list    poisoned signals, each '<ms> <reason>\n<signal>'
-- ARGV[1] pump       this Pump's id        ARGV[2] lease_ms  the sweep lease's lifetime
-- ARGV[3] limit      most candidates per index per call (bounded work: O(expired))
-- ARGV[4..17] defaults, in the order of the config fields below ('' = unlimited)
--
-- Settings (config fields, ms and counts): completed_age completed_count dead_age dead_count
-- failed_age failed_count closed_age closed_count unclosed_age unclosed_count cancelled_age
-- cancelled_count poison_age poison_count. A field holding '-1' means unlimited.
-- Steps: per index, the ids older than its age and the oldest beyond its count (at most
-- `limit` each). When nothing is due, nothing is written (an idle Pump writes nothing). Else
-- the sweep lease is taken (or renewed) - when another Pump holds it, nothing is returned
-- and nothing changes - and the poison list is trimmed by age and count here.
-- Full server: runs (allow-oom): it trims the poison list; its only write besides is the sweep
--  lease (a few bytes), which lets the sweep free memory.
-- Owner of what it writes: the lease expires by itself (PX).
-- Returns: {{completed ids}, {dead ids}, {failed ids}, {closed ids}, {released ids},
--           {cancelled ids}, poison entries removed}.
local q = queue_keys(KEYS)
local names = {'completed_age', 'completed_count', 'dead_age', 'dead_count', 'failed_age',
  'failed_count', 'closed_age', 'closed_count', 'unclosed_age', 'unclosed_count',
  'cancelled_age', 'cancelled_count', 'poison_age', 'poison_count'}
local conf = redis.call('HMGET', KEYS[16], unpack(names))
local set = {}
for i = 1, #names do
  local v = conf[i] or ARGV[3 + i]
  if v == '-1' then v = '' end
  set[i] = v
end
local now = now_ms()
local limit = tonumber(ARGV[3])
local out, due = {}, false
local indexes = {q.completed, q.dead, q.flows_failed, q.flows_closed, q.flows_released,
  q.flows_cancelled}
for k = 1, 6 do
  local key, age, count = indexes[k], set[2 * k - 1], set[2 * k]
  local ids, seen = {}, {}
  if age ~= '' then
    ids = redis.call('ZRANGEBYSCORE', key, '-inf', now - tonumber(age), 'LIMIT', 0, limit)
    for _, id in ipairs(ids) do seen[id] = true end
  end
  if count ~= '' then
    local over = redis.call('ZCARD', key) - tonumber(count)
    if over > 0 then
      for _, id in ipairs(redis.call('ZRANGE', key, 0, math.min(over, limit) - 1)) do
        if not seen[id] then ids[#ids + 1] = id; seen[id] = true end
      end
    end
  end
  if #ids > 0 then due = true end
  out[k] = ids
end
local p_age, p_count = set[13], set[14]
local p_len = redis.call('LLEN', KEYS[18])
local p_due = p_len > 0 and p_count ~= '' and p_len > tonumber(p_count)
if p_len > 0 and not p_due and p_age ~= '' then
  local head = redis.call('LINDEX', KEYS[18], 0)
  local stamp = tonumber(string.match(head, '^(%d+) ')) or 0
  p_due = stamp <= now - tonumber(p_age)
end
if not due and not p_due then return {{}, {}, {}, {}, {}, {}, 0} end
local holder = redis.call('GET', KEYS[17])
if holder and holder ~= ARGV[1] then return {{}, {}, {}, {}, {}, {}, 0} end
redis.call('SET', KEYS[17], ARGV[1], 'PX', tonumber(ARGV[2]))
local trimmed = 0
if p_due then
  if p_count ~= '' and p_len > tonumber(p_count) then
    local cut = math.min(p_len - tonumber(p_count), limit)
    redis.call('LTRIM', KEYS[18], cut, -1)
    trimmed = cut
  end
  if p_age ~= '' then
    while trimmed < limit do
      local head = redis.call('LINDEX', KEYS[18], 0)
      if not head then break end
      local stamp = tonumber(string.match(head, '^(%d+) ')) or 0
      if stamp > now - tonumber(p_age) then break end
      redis.call('LPOP', KEYS[18])
      trimmed = trimmed + 1
    end
  end
end
out[7] = trimmed
return out
