-- recover: return jobs whose lease expired (their worker died or stalled) to pending.
-- @include now_ms
-- @include signal
--
-- KEYS[1] active  KEYS[2] leases  KEYS[3] pending  KEYS[4] dead
-- KEYS[5] outbox  this queue's flow:outbox
-- KEYS[6] wake    zset  set when jobs become claimable (idle workers block on it)
-- KEYS[7] outbox:wake zset set when a signal is pushed to the outbox (an idle Pump blocks on it)
-- KEYS[7+i]       the row of candidate i
-- ARGV[1] queue   this queue's name
-- ARGV[2] max_stalls  a job whose lease expired more than this many times is buried
-- ARGV[3..]       candidate ids (read by the host from active, by deadline)
--
-- Steps: for each candidate still in active with a deadline in the past (re-checked here, so a
-- heartbeat that landed since the host's read wins): drop it from active and leases, count a
-- stall, and put it at the FRONT of pending (it has waited already). A job past max_stalls
-- dies instead; its parent, if any, is settled through this queue's outbox by its policy token
-- (the Pump delivers, same-queue parents included: no parent key is derived here).
-- Owner of what it writes: pending entries are claimed; dead entries go with the dead retention
-- (expire.lua), a plain job's row with them, a flow child's row with its flow; the stalls/state
-- fields go with the row; outbox signals are trimmed by the Pump; the wake member is popped by
-- idle workers, the outbox:wake member by an idle Pump.
-- Returns: {recovered, buried, {id, error, payload, attempts, max_attempts, parent,
-- parent_queue, parent_policy, stalls, timeout} per buried job} - the row fields in the order the claim
-- reads them (ops.ROW_FIELDS), so the host can report each death to its lifecycle hooks.
local queue, max_stalls = ARGV[1], tonumber(ARGV[2])
local now = now_ms()
local back, dead, gone, signals, reports = {}, {}, {}, {}, {}
for i = 3, #ARGV do
  local id, row = ARGV[i], KEYS[5 + i]
  local deadline = redis.call('ZSCORE', KEYS[1], id)
  if deadline and tonumber(deadline) <= now then
    gone[#gone + 1] = id
    if redis.call('EXISTS', row) == 1 then
      local stalls = redis.call('HINCRBY', row, 'stalls', 1)
      if stalls > max_stalls then
        local err = 'lease expired ' .. stalls .. ' times'
        redis.call('HSET', row, 'state', 'dead', 'error', err, 'finished', now)
        redis.call('HDEL', row, 'traceback')  -- a stall has none; an earlier attempt's misleads
        dead[#dead + 1] = now; dead[#dead + 1] = id
        local r = redis.call('HMGET', row, 'payload', 'attempts', 'max_attempts', 'parent',
          'parent_queue', 'parent_policy', 'stalls', 'timeout', 'epoch')
        reports[#reports + 1] = {id, err, r[1], r[2], r[3], r[4], r[5], r[6], r[7], r[8]}
        if r[4] then
          local kind = 'f'
          if r[6] == 'id' then kind = 'i' end
          signals[#signals + 1] = signal(kind, id, r[5] or queue, r[4], death(r[9], err))
        end
      else
        back[#back + 1] = 0; back[#back + 1] = id
      end
    end
  end
end
if #gone > 0 then
  redis.call('ZREM', KEYS[1], unpack(gone))
  redis.call('HDEL', KEYS[2], unpack(gone))
end
if #back > 0 then
  redis.call('ZADD', KEYS[3], unpack(back))
  redis.call('ZADD', KEYS[6], 0, 'w')
end
if #dead > 0 then redis.call('ZADD', KEYS[4], unpack(dead)) end
push_signals(KEYS[5], KEYS[7], signals)
return {math.floor(#back / 2), math.floor(#dead / 2), reports}
