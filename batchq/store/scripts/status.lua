-- status.lua: where one job is, read atomically from its queue's keys (no list scan).
--
-- KEYS[1]  pending hash: id -> "r" (ready) or the entry (delayed)
-- KEYS[2]  inflight hash: id -> entry of a reserved (running) job, and the bundles
-- KEYS[3]  dead:jobs hash: id -> dead record
-- KEYS[4]  cancelled zset: id -> when it was cancelled
-- KEYS[5]  cancel hash: cancelled ready jobs not popped yet; "X": a job dropped unrun at
--          its deadline (pop.lua, kept for a while)
-- KEYS[6]  seq counter; KEYS[7..10] waiting bitmaps, slots 0..3 (enqueue.lua)
-- The key after those: the job's result key (KEYS[RESULTS + 1]).
-- ARGV[1]  job id
-- ARGV[2]  "1": also return the result value or the dead record
-- Returns  {state} or {state, payload}: state is ready, delayed, reserved, succeeded
--          (while its result is kept), dead, cancelled, expired or unknown.
local pending = KEYS[1]
local inflight = KEYS[2]
local dead_jobs = KEYS[3]
local cancelled = KEYS[4]
local cancel = KEYS[5]
local seq = KEYS[6]
local WAIT0 = 7  -- KEYS[WAIT0 + s] is the bitmap of slot s (0..3)
local RESULTS = 10  -- KEYS[RESULTS + 1] is the job's result key

local id = ARGV[1]
local want = ARGV[2] == '1'
local v = redis.call('HGET', pending, id)
if v then
  if v == 'r' then return {'ready'} end
  return {'delayed'}
end
local slot, off = wait_pos(seq_top(seq), seq_of(id))
if slot and redis.call('GETBIT', KEYS[WAIT0 + slot], off) == 1 then
  return {'ready'}
end
if is_running(inflight, id) then
  return {'reserved'}
end
if want then
  local r = redis.call('GET', KEYS[RESULTS + 1])
  if r then return {'succeeded', r} end
  local d = redis.call('HGET', dead_jobs, id)
  if d then return {'dead', d} end
else
  if redis.call('EXISTS', KEYS[RESULTS + 1]) == 1 then return {'succeeded'} end
  if redis.call('HEXISTS', dead_jobs, id) == 1 then return {'dead'} end
end
if redis.call('ZSCORE', cancelled, id) then return {'cancelled'} end
local t = redis.call('HGET', cancel, id)
if t == 'X' then return {'expired'} end
-- "x"/"k": the expiry tombstone of a job that ran past its deadline and ended
if t and t ~= 'x' and t ~= 'k' then return {'cancelled'} end
return {'unknown'}
