-- periodic_tick.lua: enqueue one tick of a periodic task at most once, whoever calls.
--
-- The schedule's last enqueued tick is kept next to the queue (same hash tag), so the
-- check and the RPUSH are one atomic step on one slot: two schedulers that both believe
-- they lead still cannot enqueue a tick twice, and a tick older than the last one
-- enqueued is never run (ticks only move forward).
--
-- KEYS[1]  the queue's periodic hash: "<task>:tick" last enqueued tick (ms),
--          "<task>:run" server time it was enqueued (ms), "<task>:next" next tick (ms),
--          "<task>:schedule" the schedule as text, "<task>:lock" its leader lock's name
--          (so `batchq info` can show them without the app)
-- KEYS[2]  ready list of the task's priority
-- KEYS[3]  wake list of the queue
-- KEYS[4]  stats hash (field "enqueued")
-- KEYS[5]  pending hash: id -> "r" (job_status, cancel.lua)
-- ARGV[1]  task name
-- ARGV[2]  the tick (ms, Unix time): the latest tick at or before now
-- ARGV[3]  the tick after it (ms), recorded as the next run
-- ARGV[4]  grace in ms: a tick found at most this late still runs
-- ARGV[5]  "1" (catch_up): a tick found later than the grace still runs once, if the
--          schedule ran before; "0": it is skipped
-- ARGV[6]  the encoded job entry
-- ARGV[7]  the schedule as text
-- ARGV[8]  the name of the leader lock of the caller's app
-- Returns  {1, now}      enqueued
--          {0, last}     this tick (or a later one) was already enqueued
--          {2, now}      skipped: missed by more than the grace (downtime)
--          {-1, wait_ms} not due yet by this server's clock
local periodic = KEYS[1]
local ready = KEYS[2]
local wake = KEYS[3]
local stats = KEYS[4]
local pending = KEYS[5]
local name = ARGV[1]
local tick = tonumber(ARGV[2])
local now = now_ms()
if tick > now then
  return {-1, tick - now}
end
local last = redis.call('HGET', periodic, name .. ':tick')
if last and tonumber(last) >= tick then
  return {0, tonumber(last)}
end
if now - tick > tonumber(ARGV[4]) and not (ARGV[5] == '1' and last) then
  redis.call('HSET', periodic, name .. ':next', ARGV[3], name .. ':schedule', ARGV[7],
             name .. ':lock', ARGV[8])
  return {2, now}
end
-- the job first: a full Redis refuses it before anything else is written
redis.call('RPUSH', ready, ARGV[6])
redis.call('HSET', periodic, name .. ':tick', tick, name .. ':run', now, name .. ':next', ARGV[3],
           name .. ':schedule', ARGV[7], name .. ':lock', ARGV[8])
redis.call('HINCRBY', stats, 'enqueued', 1)
local _, _, _, id = parse(ARGV[6])
if id then index_pending(pending, {id, 'r'}) end
leave_wake_token(wake)
return {1, now}
