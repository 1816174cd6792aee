-- death(epoch, err): what a dying child reports (the value of an 'i' or 'f' record): its error,
-- prefixed with its repair epoch when a repair re-ran it ("\1<epoch>\1<error>"), so its parent
-- can tell a report of this run from a stale one of a run before the repair (settle.lua).
local function death(epoch, err)
  if epoch then return '\1' .. epoch .. '\1' .. err end
  return err
end
