-- holder(token): the attempt a lease token names, as fail.lua's attempt records hold it:
-- {started, worker} - the claim time in ms (decimal) and the claiming worker's id tail
-- (workers_registry.lease_token: '<tail>.<ms hex>.<random>'); worker is false for a claim
-- made outside a worker; both false for a token of an older worker (32 hex, no dots).
-- Owner of what it writes: nothing - a pure read of the token; includes/attempt.lua writes
-- what it returns into the row's 'history', which goes with the row.
local function holder(token)
  local tail, ms = string.match(token, '^(%x*)%.(%x+)%.%x+$')
  if not ms then return {false, false} end
  if tail == '' then tail = false end
  return {string.format('%d', tonumber(ms, 16)), tail}
end
