-- enqueue_group.lua: write jobs of one group (flow control): ready ones into the group's
-- place in gready, delayed ones into the delayed set; all within the group's quota.
--
-- KEYS[1]  gready zset           KEYS[5]  limits hash
-- KEYS[2]  groups zset           KEYS[6]  delayed zset
-- KEYS[3]  gwait zset            KEYS[7]  wake list
-- KEYS[4]  gstate hash: "<g>:n" counts the group's unfinished jobs (the quota)
-- KEYS[8]  inflight hash (the retry check)
-- KEYS[9]  stats hash (field "enqueued" counts every job written)
-- KEYS[10] pending hash: id -> entry of each delayed job (job_status, cancel.lua)
-- KEYS[11] seq counter; KEYS[12..15] waiting bitmaps, slots 0..3: the bits of ready
--          jobs' sequence numbers are set (as in enqueue.lua)
-- ARGV[1]  "1" when this call retries one whose reply was lost: if its first job is
--          already written (waiting, delayed or running), nothing is written again
-- ARGV[2]  "ready", "rel" (ARGV[3] is a delay in ms from the server's now) or "abs"
--          (ARGV[3] is a Unix time in ms)
-- ARGV[3]  the delay or the due time (0 for "ready")
-- ARGV[4]  the group (hex of its name, limits.group_hex)
-- ARGV[5]  the jobs' priority
-- ARGV[6]  the ready jobs' sequence numbers as runs "first:count,..." ("" for none)
-- ARGV[7..] encoded jobs (1..1000 per call; the caller chunks)
-- Returns  the group's unfinished jobs after the write; -1 when the retry found the jobs
--          written; -2 when the write would take the group past its max_pending
--          (nothing written).
local gready = KEYS[1]
local groups = KEYS[2]
local gwait = KEYS[3]
local gstate = KEYS[4]
local limits = KEYS[5]
local delayed = KEYS[6]
local wake = KEYS[7]
local inflight = KEYS[8]
local stats = KEYS[9]
local pending = KEYS[10]
local seq = KEYS[11]
local WAIT0 = 12  -- KEYS[WAIT0 + s] is the bitmap of slot s (0..3)

local mode, g, p = ARGV[2], ARGV[4], tonumber(ARGV[5])
local count = #ARGV - 6
local top = seq_top(seq)
if ARGV[1] == '1' then
  local _, _, _, id = parse(ARGV[7])
  local slot, off = wait_pos(top, id and seq_of(id))
  if (id and (redis.call('HEXISTS', inflight, id) == 1
              or redis.call('HEXISTS', pending, id) == 1))
      or (slot and redis.call('GETBIT', KEYS[WAIT0 + slot], off) == 1) then
    return -1
  end
end
local lim = limit_of(redis.call('HGET', limits, g)) or limit_of(redis.call('HGET', limits, '*'))
local n = tonumber(redis.call('HGET', gstate, g .. ':n') or '0')
if lim and lim.max and n + count > lim.max then
  return -2
end
if mode == 'ready' then
  gpush_tail(gready, gstate, g, p, ARGV, 7)
  gwake(groups, gwait, gstate, g)
  mark_waiting(top, ARGV[6], WAIT0)
else
  local due = tonumber(ARGV[3])
  if mode == 'rel' then due = now_ms() + due end
  add_delayed(delayed, pending, due, 7)
end
redis.call('HINCRBY', stats, 'enqueued', count)
leave_wake_token(wake)
return redis.call('HINCRBY', gstate, g .. ':n', count)
