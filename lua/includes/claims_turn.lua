-- claims_turn(pending, top): V, the turn the claims are at - the turn before the lowest tag
-- waiting in `pending` (front entries of score 0 aside), so a group's first job shares the
-- head's turn; `top` (the highest tag given, the 'fair' hash's 'max') when nothing waits.
-- Shared by includes/fair.lua (the turns of an add), fair_prune.lua and fair_top.lua.
-- Owner of what it writes: nothing - a read; it creates no key.
local function claims_turn(pending, top)
  local head = redis.call('ZRANGEBYSCORE', pending, '(0', '+inf', 'LIMIT', 0, 1, 'WITHSCORES')
  if head[2] then return tonumber(head[2]) % 1099511627776 - 1 end
  return top
end
