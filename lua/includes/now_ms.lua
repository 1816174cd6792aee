-- now_ms(): the server's clock in milliseconds. Leases, due times and deaths are all stamped
-- by the server that owns the queue, so hosts with skewed clocks agree.
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
