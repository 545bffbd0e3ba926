-- enqueue.lua: append encoded jobs to one ready list and wake an idle worker.
--
-- KEYS[1]  ready list of the jobs' priority
-- KEYS[2]  wake list of the queue
-- KEYS[3]  inflight hash
-- KEYS[4]  stats hash (field "enqueued" counts every job written)
-- KEYS[5]  pending hash (not written here: see keys.py)
-- KEYS[6]  seq counter; KEYS[7..10] waiting bitmaps, slots 0..3: the bits of the jobs'
--          sequence numbers are set (job_status, cancel.lua), a few commands per run
-- ARGV[1]  "1" when this call retries one whose reply was lost: if its first job is
--          already queued or running, the earlier call landed (a script is all or
--          nothing) and nothing is written again
-- ARGV[2]  the jobs' sequence numbers as runs "first:count,first:count" ("" for none)
-- ARGV[3..] encoded jobs (1..1000 per call; the caller chunks)
-- Returns  the length of the ready list after the push, or -1 when the retry found the
--          jobs already written.
local ready = KEYS[1]
local wake = KEYS[2]
local inflight = KEYS[3]
local stats = KEYS[4]
local pending = KEYS[5]
local seq = KEYS[6]
local WAIT0 = 7  -- KEYS[WAIT0 + s] is the bitmap of slot s (0..3)

if ARGV[1] == '1' then
  local _, _, _, id = parse(ARGV[3])
  if (id and redis.call('HEXISTS', inflight, id) == 1)
      or redis.call('LPOS', ready, ARGV[3], 'RANK', -1, 'MAXLEN', 100000) then
    return -1
  end
end
local n = redis.call('RPUSH', ready, unpack(ARGV, 3))
redis.call('HINCRBY', stats, 'enqueued', #ARGV - 2)
-- results/status/cancel: the jobs' bits, per run (not per job)
mark_waiting(seq_top(seq), ARGV[2], WAIT0)
leave_wake_token(wake)
return n
