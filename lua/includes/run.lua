-- run(packed, attempts, stalls): a row's 'run' field with its attempts and stalls replaced
-- (either may be nil: kept as it was). 'run' is '<max_attempts> <attempts> <stalls> <timeout
-- ms | -> <created ms> [<policy> <gate 0|1> <parent_queue>]': everything the claim's rows read
-- needs of a row besides payload and parent, in one value (claiming.ROW_FIELDS), and the row's
-- creation time. add.lua and land.lua write max_attempts and created ONLY here (two fields
-- fewer per job; models.run_word reads them, as fail.lua and recover.lua do); hold.lua writes
-- a parent's own fields too. attempts, stalls and the parent fields are copies: their own
-- fields stay the truth (fail.lua and recover.lua decide on them), and 'run' is rewritten from
-- them whenever they change, so a copy that an older client left behind is mended by the next
-- change.
-- Returns nil when `packed` is nil or not a 'run' value (every row that add.lua, land.lua and
-- hold.lua write has one).
-- Owner of what it writes: nothing - a pure function; its callers write the value into the
-- row's 'run' field, which goes with the row.
local function run(packed, attempts, stalls)
  if not packed then return nil end
  local max, a, s, rest = string.match(packed, '^(%S+) (%S+) (%S+) (.*)$')
  if not max then return nil end
  return max .. ' ' .. (attempts or a) .. ' ' .. (stalls or s) .. ' ' .. rest
end
