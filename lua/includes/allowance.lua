-- allowance(need, total): how many of `total` fail-parent children may die under the success
-- threshold `need` as hold.lua keeps it - a count `<c>` (that many must succeed) or an exact
-- fraction `<p>/<q>` (ceil(p/q x total) must, at least 1), as the host's flows.allowance
-- computes it; in integers below 2^53, so the floor of the quotient is exact.
-- Owner of what it writes: nothing - a pure function (spawn.lua writes its value into the row's
-- `allow`, which goes with the row).
local function allowance(need, total)
  local p, d = string.match(need, '^(%d+)/(%d+)$')
  local required = tonumber(need)
  if p then
    required = math.floor((tonumber(p) * total + tonumber(d) - 1) / tonumber(d))
    if required < 1 then required = 1 end
  end
  return total - required
end
