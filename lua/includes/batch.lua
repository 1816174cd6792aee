-- batch(first, width): the batch header complete and fail share, and its lease check.
-- At ARGV[first]: n (jobs), g (same-queue parent groups), x (cross-queue parents), t (lease
-- tokens); then the g group parent ids, the x pairs (parent id, parent queue), the t tokens
-- (a batch usually shares one: it was claimed in one call); then n records of `width` values,
-- each starting with: job id, token number (1..t) - and ending with its ref: 0 a plain job,
-- k > 0 a child of same-queue group k, -k a child of cross-queue parent k.
-- Reads every job's current token with ONE HMGET of KEYS[2] (the queue's leases).
-- Returns {n, ids_at, cross, base, current}: group k's parent id is ARGV[ids_at + k]; cross
-- parent k is ARGV[cross + 2k - 1] (id), ARGV[cross + 2k] (queue); job i's values start at
-- ARGV[base + width(i - 1) + 1]; current[i] is true when job i's token is its current lease.
local function batch(first, width)
  local n, g, x, t = tonumber(ARGV[first]), tonumber(ARGV[first + 1]),
    tonumber(ARGV[first + 2]), tonumber(ARGV[first + 3])
  local ids_at = first + 3
  local cross = ids_at + g
  local tokens = cross + 2 * x
  local base = tokens + t
  local current = {}
  if n > 0 then
    local ids = {}
    for i = 1, n do ids[i] = ARGV[base + (i - 1) * width + 1] end
    local held = redis.call('HMGET', KEYS[2], unpack(ids))
    for i = 1, n do
      current[i] = held[i] == ARGV[tokens + tonumber(ARGV[base + (i - 1) * width + 2])]
    end
  end
  return {n = n, ids_at = ids_at, cross = cross, base = base, current = current}
end
