-- enqueue.lua: append encoded jobs to one ready list and wake an idle worker, or hand
-- the first jobs straight to idle workers.
--
-- KEYS[1]  ready list of the jobs' priority
-- KEYS[2]  wake list of the queue
-- KEYS[3]  inflight hash
-- KEYS[4]  stats hash (field "enqueued" counts every job written, "handed" the jobs
--          handed off)
-- KEYS[5]  pending hash (not written here: see keys.py)
-- KEYS[6]  seq counter; KEYS[7..10] waiting bitmaps, slots 0..3: the bits of the jobs'
--          sequence numbers are set (job_status, cancel.lua), a few commands per run
-- KEYS[11] reserved zset, KEYS[12] paused flag, KEYS[13] idle zset, KEYS[14] limits
--          hash, KEYS[15] gwait zset: the hand-off (below)
-- KEYS[16] evconf hash, KEYS[17] events stream: when events are on, a job handed off
--          writes "started" (as pop.lua does for the jobs it leases; read only when
--          handing off) (_events.lua)
-- ARGV[1]  "1" when this call retries one whose reply was lost: if its first job is
--          already queued or running, the earlier call landed (a script is all or
--          nothing) and nothing is written again
-- ARGV[2]  the jobs' sequence numbers as runs "first:count,first:count" ("" for none)
-- ARGV[3..] encoded jobs (1..1000 per call; the caller chunks)
-- Returns  the length of the ready list after the push, 0 when every job was handed off
--          (nothing pushed), or -1 when the retry found the jobs already written.
--
-- Hand-off. A worker whose pop found nothing registers in the idle zset (pop.lua:
-- member "<lease ms>|<worker>", scored by when the registration lapses) and blocks on
-- the wake list. While registrations are live (and the queue is neither paused, held,
-- nor under a queue-wide limit or send window), each of the call's first jobs takes
-- one: it is leased here exactly as pop.lua leases (attempt counted, inflight +
-- reserved, for the registered lease), and the leased entry itself is pushed on the wake list, so the
-- BLPOP that wakes a worker hands it the job in the same round trip. Nothing new can
-- be lost: the job is reserved from this moment, so a worker that dies holding it, or
-- an entry nobody takes, is reaped when the lease expires (pop.lua then also removes
-- the entry from the wake list, so it never runs twice). Any pop of the queue claims
-- handed entries still on the wake list before popping ready jobs. A retried call
-- (ARGV[1] = "1") hands nothing off. Registrations are taken soonest-lapsing first
-- (ZPOPMIN): a lapsed one (its worker stopped or died) is dropped when popped, and its
-- job waits in the ready list like any job that found no registration. A handed job's
-- waiting bit is never set, and a call that hands off every job writes no bit and pushes
-- nothing: the hand-off of one job is 11 commands.
local ready = KEYS[1]
local wake = KEYS[2]
local inflight = KEYS[3]
local stats = KEYS[4]
local pending = KEYS[5]
local seq = KEYS[6]
local WAIT0 = 7  -- KEYS[WAIT0 + s] is the bitmap of slot s (0..3)
local reserved = KEYS[11]
local paused = KEYS[12]
local idle = KEYS[13]
local limits = KEYS[14]
local gwait = KEYS[15]
local evconf = KEYS[16]
local events = KEYS[17]

if ARGV[1] == '1' then
  local _, _, _, id = parse(ARGV[3])
  if (id and is_running(inflight, id))
      or redis.call('LPOS', ready, ARGV[3], 'RANK', -1, 'MAXLEN', 100000) then
    return -1
  end
end
-- the first write is one Redis refuses when it is out of memory (HINCRBY is "denyoom",
-- ZPOPMIN is not): a full Redis then refuses the whole call before anything is written,
-- registrations or not (a script that has written may go on past maxmemory)
redis.call('HINCRBY', stats, 'enqueued', #ARGV - 2)
local first = 3
local handed = {}  -- sequence numbers of the jobs handed off (they never wait)
if ARGV[1] ~= '1' and redis.call('ZCARD', idle) > 0 then
  local now = now_ms()
  -- the events config is named twice: EXISTS counts each mention (odd: paused; >= 2:
  -- events on), so a hand-off with events off costs no command more
  local flags = redis.call('EXISTS', paused, evconf, evconf)
  -- the queue's own limit and send window: a job of a limited or windowed queue waits
  -- for a pop, which applies them
  local own = redis.call('HMGET', limits, QUEUE, QUEUE .. '#w')
  if flags % 2 == 0 and not own[1] and not own[2]
      and tonumber(redis.call('ZSCORE', gwait, QUEUE) or '0') <= now then
    -- one registration per job; a lapsed one popped here is dropped, not used
    local regs = redis.call('ZPOPMIN', idle, #ARGV - 2)
    local hargs, zargs = {}, {}
    for i = 1, #regs, 2 do
      if tonumber(regs[i + 1]) > now then
        local id, r, lease_name = count_attempt(ARGV[first])
        if not id then break end  -- malformed: it waits in the ready list, pop buries it
        local lease = tonumber(string.match(regs[i], '^(%d+)|')) or 30000
        hargs[#hargs + 1] = id
        hargs[#hargs + 1] = r
        zargs[#zargs + 1] = now + lease
        zargs[#zargs + 1] = lease_name
        handed[#handed + 1] = seq_of(id)
        first = first + 1
      end
    end
    if #hargs > 0 then
      lease_entries(inflight, hargs)
      redis.call('ZADD', reserved, unpack(zargs))
      for i = 2, #hargs, 2 do redis.call('RPUSH', wake, hargs[i]) end
      redis.call('HINCRBY', stats, 'handed', #hargs / 2)
      local ev = flags >= 2 and ev_open(evconf)
      if ev then
        for i = 2, #hargs, 2 do
          -- (jobmeta is never read: jobs enqueued here are not tracked)
          ev_entry(events, ev, now, 'started', hargs[i], 0, nil, inflight)
        end
        ev_close(evconf, events, ev, now)
      end
    end
  end
end
if first > #ARGV then
  return 0  -- every job handed off: nothing pushed, nothing waits
end
-- results/status/cancel: the waiting jobs' bits, per run (not per job)
table.sort(handed)
mark_waiting(seq_top(seq), ARGV[2], WAIT0, handed)
local n = redis.call('RPUSH', ready, unpack(ARGV, first))
leave_wake_token(wake)
return n
