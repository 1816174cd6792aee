-- queue_keys(keys): the shared keys of one queue, by name. Every script that touches a queue's
-- sets takes these first, as KEYS[1..15], in this one order; the host builds them with
-- echomq_core.wire.keyspace.Keyspace.queue_keys (QUEUE_KEYS there is this list). A script's own keys
-- (rows, a parent's keys, Pump and retention records) follow from KEYS[16].
-- KEYS[1]  pending = pending                  zset    claimable jobs
-- KEYS[2]  wake = wake                        zset    the idle workers' wake-up hint
-- KEYS[3]  seq = seq                          string  the arrival counter (FIFO)
-- KEYS[4]  active = active                    zset    leased jobs by lease deadline
-- KEYS[5]  leases = leases                    hash    job id -> lease token
-- KEYS[6]  delayed = delayed                  zset    jobs by due time (retries, delayed adds)
-- KEYS[7]  dead = dead                        zset    the morgue by time of death
-- KEYS[8]  completed = completed              zset    finished jobs by finish time
-- KEYS[9]  outbox = flow:outbox               list    signals to parents in other queues
-- KEYS[10] outbox_wake = flow:outbox:wake     zset    the Pump's wake-up hint
-- KEYS[11] flows_held = flows:held            zset    root flows held, by creation time
-- KEYS[12] flows_released = flows:released    zset    released barrier flows not yet closed
-- KEYS[13] flows_closed = flows:closed        zset    closed flows by close time
-- KEYS[14] flows_failed = flows:failed        zset    failed root flows by failure time
-- KEYS[15] flows_cancelled = flows:cancelled  zset    cancelled root flows by cancel time
-- Who removes each of them: see echomq_core/wire/keyspace.py, and the header of each script for
-- what that script writes.
local function queue_keys(keys)
  return {pending = keys[1], wake = keys[2], seq = keys[3], active = keys[4], leases = keys[5],
    delayed = keys[6], dead = keys[7], completed = keys[8], outbox = keys[9],
    outbox_wake = keys[10], flows_held = keys[11], flows_released = keys[12],
    flows_closed = keys[13], flows_failed = keys[14], flows_cancelled = keys[15]}
end
