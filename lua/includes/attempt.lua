-- attempt(history, token, now, outcome, err): the row's 'history' field with one failed
-- attempt appended, the oldest dropped beyond 10. One record per line:
-- '<started ms> <ended ms> <worker tail> <outcome> <first line of the error, 120 bytes at most>'
-- with outcome 'r' (a retry follows) or 'd' (the job died); started and worker come from the
-- lease token (includes/holder.lua), '-' where it does not say. At most 10 records of at most
-- about 160 bytes: 1.6 KiB per job whatever its attempts. history is the field's current
-- value (false when absent).
-- Owner of what it writes: nothing - a pure function; fail.lua writes the string it returns
-- into the row's 'history' field, which goes with the row.
local function attempt(history, token, now, outcome, err)
  local h = holder(token)
  local line = string.sub(string.match(err, '^[^\n]*'), 1, 120)
  local rec = (h[1] or '-') .. ' ' .. now .. ' ' .. (h[2] or '-') .. ' ' .. outcome .. ' ' .. line
  if not history or history == '' then return rec end
  history = history .. '\n' .. rec
  local _, breaks = string.gsub(history, '\n', '')
  if breaks >= 10 then history = string.sub(history, string.find(history, '\n', 1, true) + 1) end
  return history
end
