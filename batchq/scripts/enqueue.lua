-- enqueue.lua: append encoded jobs to one ready list and wake an idle worker.
--
-- KEYS[1]  ready list of the jobs' priority
-- KEYS[2]  wake list of the queue
-- KEYS[3]  inflight hash
-- KEYS[4]  stats hash (field "enqueued" counts every job written)
-- KEYS[5]  pending hash: id -> "r" for every job written (job_status, cancel.lua)
-- ARGV[1]  "1" when this call retries one whose reply was lost: if its first job is
--          already queued or running, the earlier call landed (a script is all or
--          nothing) and nothing is written again
-- ARGV[2..] encoded jobs (1..1000 per call; the caller chunks)
-- Returns  the length of the ready list after the push, or -1 when the retry found the
--          jobs already written.
local ready = KEYS[1]
local wake = KEYS[2]
local inflight = KEYS[3]
local stats = KEYS[4]
local pending = KEYS[5]

if ARGV[1] == '1' then
  local _, _, _, id = parse(ARGV[2])
  if (id and redis.call('HEXISTS', inflight, id) == 1)
      or redis.call('LPOS', ready, ARGV[2], 'RANK', -1, 'MAXLEN', 100000) then
    return -1
  end
end
local n = redis.call('RPUSH', ready, unpack(ARGV, 2))
redis.call('HINCRBY', stats, 'enqueued', #ARGV - 1)
-- results/status/cancel: index the jobs by id
local marks = {}
for i = 2, #ARGV do
  local _, _, _, id = parse(ARGV[i])
  if id then
    marks[#marks + 1] = id
    marks[#marks + 1] = 'r'
  end
end
index_pending(pending, marks)
leave_wake_token(wake)
return n
