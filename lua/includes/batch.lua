-- batch(leases, args, first, width): the batch header complete and fail share, and its lease
-- check. leases = the queue's leases key; args = the script's ARGV.
-- At args[first]: n (jobs), g (same-queue parent groups), x (cross-queue parents), t (lease
-- tokens), s (the shared ref, or ''); then the g group parent ids, the x pairs (parent id,
-- parent queue), the t tokens (a batch usually shares one: it was claimed in one call); then
-- n records of `width` values, each starting with: job id, token number (1..t) - and ending
-- with its ref: 0 a plain job, k > 0 a child of same-queue group k, -k a child of cross-queue
-- parent k. When s is not '' (one token, every job's ref s: the usual batch) a record is
-- only the job id and its values (width - 2), its token number 1 and its ref s.
-- Reads every job's current token with ONE HMGET of `leases`.
-- Returns {n, parents, cross, base, current, tokens, width, shared}: parents[k] is group k's
-- parent id; cross parent k is args[cross + 2k - 1] (id), args[cross + 2k] (queue); job i's
-- record starts at args[base + width(i - 1) + 1] (width as returned); current[i] is true when
-- job i's token is its current lease; token number k is args[tokens + k]; shared is the
-- shared ref (a number) or nil when each record carries its token number and ref.
-- Owner of what it writes: nothing - one HMGET of `leases`; it creates no key.
local function batch(leases, args, first, width)
  local n, g, x, t = tonumber(args[first]), tonumber(args[first + 1]),
    tonumber(args[first + 2]), tonumber(args[first + 3])
  local shared = tonumber(args[first + 4])
  local ids_at = first + 4
  local cross = ids_at + g
  local tokens = cross + 2 * x
  local base = tokens + t
  if shared then width = width - 2 end
  local parents, current = {}, {}
  for k = 1, g do parents[k] = args[ids_at + k] end
  if n > 0 then
    local ids = {}
    for i = 1, n do ids[i] = args[base + (i - 1) * width + 1] end
    local held = redis.call('HMGET', leases, unpack(ids))
    if shared then
      local token = args[tokens + 1]
      for i = 1, n do current[i] = held[i] == token end
    else
      for i = 1, n do
        current[i] = held[i] == args[tokens + tonumber(args[base + (i - 1) * width + 2])]
      end
    end
  end
  return {n = n, parents = parents, cross = cross, base = base, current = current,
    tokens = tokens, width = width, shared = shared}
end
