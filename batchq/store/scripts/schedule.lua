-- schedule.lua: add encoded jobs to the delayed set, due at a server-clock time.
--
-- KEYS[1]  delayed zset
-- KEYS[2]  wake list (an idle worker wakes to learn the new earliest due time)
-- KEYS[3]  inflight hash
-- KEYS[4]  ready list of the jobs' priority
-- KEYS[5]  stats hash (field "enqueued")
-- KEYS[6]  pending hash: id -> the entry, for every job written (job_status, cancel.lua)
-- ARGV[1]  "1" when retrying a call whose reply was lost (see enqueue.lua)
-- ARGV[2]  "rel": ARGV[3] is a delay in ms from the server's now;
--          "abs": ARGV[3] is a Unix time in ms
-- ARGV[3]  the delay or the due time
-- ARGV[4..] encoded jobs (at most 1000 per call)
-- Returns  the due time used (ms), or -1 when the retry found the jobs already written.
local delayed = KEYS[1]
local wake = KEYS[2]
local inflight = KEYS[3]
local ready = KEYS[4]
local stats = KEYS[5]
local pending = KEYS[6]

if ARGV[1] == '1' then
  local _, _, _, id = parse(ARGV[4])
  if redis.call('ZSCORE', delayed, ARGV[4])
      or (id and is_running(inflight, id))
      or redis.call('LPOS', ready, ARGV[4], 'RANK', -1, 'MAXLEN', 100000) then
    return -1
  end
end
local due = tonumber(ARGV[3])
if ARGV[2] == 'rel' then
  due = now_ms() + due
end
-- results/status/cancel: the jobs are indexed by id too (_writes.lua add_delayed)
add_delayed(delayed, pending, due, 4)
redis.call('HINCRBY', stats, 'enqueued', #ARGV - 3)
leave_wake_token(wake)
return due
