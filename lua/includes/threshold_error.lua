-- threshold_error(failed_key, failures, allow, last): the reason a threshold parent failed
-- (settle_current.lua): how many failed, how many were allowed, and the first few of their ids
-- (a bounded HSCAN page of :failed, then `last`, the death that tipped it; failed_children
-- lists them all). A read; it writes nothing.
local function threshold_error(failed_key, failures, allow, last)
  local names = {}
  local page = redis.call('HSCAN', failed_key, 0, 'COUNT', 5)[2]
  for i = 1, #page, 2 do
    if #names < 5 and page[i] ~= last then names[#names + 1] = page[i] end
  end
  names[#names + 1] = last
  local more = ''
  if failures > #names then more = ', ...' end
  return failures .. ' children failed, more than the ' .. allow .. ' allowed (min_success): ' ..
    table.concat(names, ', ') .. more
end
