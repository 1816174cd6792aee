#!lua flags=no-writes
-- fair_top: a read; a queue's fairness groups with work waiting, and the busiest of them.
-- @include claims_turn
--
-- KEYS[1] fair     hash  the queue's fairness tags (includes/fair.lua)
-- KEYS[2] pending  zset  the queue's pending jobs
-- ARGV[1] top      how many of the busiest groups to return
-- ARGV[2] limit    how many fields to look at, at most (bounded work: HSCAN slices)
--
-- Steps: V as includes/fair.lua finds it; then the hash's fields, a slice at a time, up to
-- `limit`. A group whose tag is T > V has T - V turns queued beyond the claims, each of
-- `weight` jobs ('w:<group>', 1 when absent) but the last, which holds its own count: with
-- every job of it pending, that is its number of pending jobs (its jobs that run, wait for a
-- retry or were recovered to the front are not counted). The `top` largest are returned.
-- Full server: runs (no-writes): it only reads.
-- Owner of what it writes: nothing; a read, it creates no key.
-- Returns: {groups with turns queued, 1 if every field was read else 0, group, turns, ...}
--   (the busiest first).
local fk, pending = KEYS[1], KEYS[2]
local top, limit = tonumber(ARGV[1]), tonumber(ARGV[2])
local max = redis.call('HGET', fk, 'max')
if not max then return {0, 1} end
local v = claims_turn(pending, tonumber(max))
local waiting, weight, seen, cursor = {}, {}, 0, '0'
repeat
  local scan = redis.call('HSCAN', fk, cursor, 'COUNT', 500)
  cursor = scan[1]
  local flat = scan[2]
  for i = 1, #flat, 2 do
    seen = seen + 1
    local kind, name = string.sub(flat[i], 1, 2), string.sub(flat[i], 3)
    if kind == 'g:' then
      local tag, used = string.match(flat[i + 1], '^(%d+) ?(%d*)$')
      if tonumber(tag) > v then waiting[#waiting + 1] = {name, tonumber(tag), tonumber(used)} end
    elseif kind == 'w:' then
      weight[name] = tonumber(flat[i + 1])
    end
  end
until cursor == '0' or seen >= limit
-- jobs queued: the turns after the claims' times the weight, the last turn's own count
local best = {}
for i = 1, #waiting do
  local name, tag, used = waiting[i][1], waiting[i][2], waiting[i][3]
  local w = weight[name] or 1
  best[i] = {name, (tag - v - 1) * w + (used or w)}
end
table.sort(best, function(a, b) return a[2] > b[2] or (a[2] == b[2] and a[1] < b[1]) end)
local out = {#waiting, cursor == '0' and 1 or 0}
for i = 1, math.min(top, #best) do
  out[#out + 1] = best[i][1]; out[#out + 1] = best[i][2]
end
return out
