-- @include gate
-- @include hand
-- free_tokens(q, keys, at, parents, freed, refs, spec, now): the tail complete.lua and fail.lua
-- share - the tokens their step returned go back to each gate, which admits the next children
-- (handed off to the completing worker when its spec allows: includes/hand.lua).
--   keys    = the script's KEYS; the gates' {waiting, cap} pairs start at keys[at + 1] (one pair
--             per entry of freed), then the queue's config hash (hand.lua reads its rate)
--   parents = how many parent groups the step settled; their 7 keys each (row first) end just
--             before keys[at + 1]
--   freed   = per gate, the tokens returned (0: none); refs = per gate, its parent group's
--             number when the parent is in this queue (its row is read), else 0
--   spec    = the worker's hand-off spec (ARGV; '' for none)
-- A same-queue parent that a threshold tipped (settle_current.lua) admits no more: its gate is
-- marked off before it could admit (its unstarted children are being cancelled, as park.lua
-- and cancel_children.lua mark it).
-- Returns the ids handed to the worker ({} when none).
-- Owner of what it writes: the gate's (includes/gate.lua).
local function free_tokens(q, keys, at, parents, freed, refs, spec, now)
  local h = nil
  if #freed > 0 then h = hand(spec, keys[at + 2 * #freed + 1], now) end
  for g = 1, #freed do
    if freed[g] > 0 then
      local gk = {keys[at + 2 * g - 1], keys[at + 2 * g]}
      local row = keys[at - 7 * parents + 7 * (refs[g] - 1) + 1]
      if refs[g] > 0 and redis.call('HEXISTS', row, 'tipped') == 1 then
        redis.call('HSET', gk[2], 'off', '1')
      end
      gate(q, gk, freed[g], h)
    end
  end
  return h and h.ids or {}
end
