#!lua
-- epoch: an orchestrator's attempt counter on a flow's root row. The adapters record the
-- attempt that last took the flow up (Airflow: the DAG run's clear number, written by the
-- adding task and by each waiting task when it starts), so a failure callback of an older
-- attempt, delivered late, can tell that a newer one owns the flow now and leave it.
--
-- KEYS[1] row   the root's row
-- ARGV[1] epoch a decimal integer >= 0 (the host checks); 0 only reads
-- Steps: nothing when the row does not exist (no flow: nothing to own). The field keeps the
-- largest epoch ever written: an older attempt's late write does not lower it.
-- Full server: refused before it runs (no allow-oom): it may grow memory, so it writes all or
--  nothing.
-- Owner of what it writes: the `epoch` field goes with the root's row.
-- Returns: the row's epoch after the call (0 when none was recorded), or false: no such row.
local current = tonumber(redis.call('HGET', KEYS[1], 'epoch') or '0')
local asked = tonumber(ARGV[1])
if asked > current then
  if redis.call('EXISTS', KEYS[1]) == 0 then return false end
  redis.call('HSET', KEYS[1], 'epoch', ARGV[1])
  return asked
end
if current == 0 and redis.call('EXISTS', KEYS[1]) == 0 then return false end
return current
