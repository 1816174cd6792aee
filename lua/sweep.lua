-- sweep: forget jobs that completed longer ago than the retention period.
-- @include now_ms
--
-- KEYS[1]   completed  zset  finished jobs by finish time (ms)
-- KEYS[1+5(i-1)+1 .. +5]  for candidate i: its row, dependencies, processed, unsuccessful,
--                         failed (a parent's records go with it; for a plain job they are absent)
-- ARGV[1]   retention_ms  how long a completed job is kept
-- ARGV[2..] candidate ids (read by the host from completed, oldest first)
-- Steps: for each candidate still in completed with a finish time older than now minus the
-- retention (re-checked here), delete its keys and drop it from completed.
-- Returns: the number swept.
local cutoff = now_ms() - tonumber(ARGV[1])
local swept = {}
for i = 2, #ARGV do
  local score = redis.call('ZSCORE', KEYS[1], ARGV[i])
  if score and tonumber(score) <= cutoff then
    local k = 1 + (i - 2) * 5
    redis.call('DEL', KEYS[k + 1], KEYS[k + 2], KEYS[k + 3], KEYS[k + 4], KEYS[k + 5])
    swept[#swept + 1] = ARGV[i]
  end
end
if #swept > 0 then redis.call('ZREM', KEYS[1], unpack(swept)) end
return #swept
