-- pop.lua: the worker's one call per fetch. Atomically:
--   1. moves up to ARGV[3] due delayed jobs to their ready lists (tail),
--   2. returns up to ARGV[3] expired reservations to their ready lists (head); see
--      "crash marks" below for which attempts are refunded and which jobs die,
--   3. unless the queue is paused, pops up to ARGV[1] jobs, highest priority first,
--      counts the attempt, and reserves each until now + ARGV[2] ms.
--
-- KEYS[1]  delayed zset          KEYS[5]  dead:jobs hash
-- KEYS[2]  reserved zset         KEYS[6]  wake list
-- KEYS[3]  inflight hash         KEYS[7]  paused flag
-- KEYS[4]  dead zset             KEYS[8..17]  ready lists, priority 9 down to 0
-- KEYS[18] stats hash: "dead" counts the leases dead-lettered here; "malformed" numbers
--          the malformed entries, so identical ones each keep their own dead record
-- KEYS[19] recovered hash: id -> "<recoveries>:<crashes>" of jobs taken back from a
--          worker whose lease expired
-- KEYS[20] started hash: id -> lease whose handler started in isolation (start.lua)
-- KEYS[21] campaigns hash, KEYS[22] jobmeta hash, KEYS[23] dedup hash, KEYS[24]
--          dedup:exp zset: tracked jobs (ids ending "_m", _tracked.lua) reaped dead are
--          settled; a popped job of a campaign cancelled on this queue is not reserved:
--          it is dropped and counted cancelled (in its campaign and in stats
--          "cancelled")
-- KEYS[25] pending hash: id -> "r" | delayed entry (see enqueue.lua); kept in step with
--          every move below, and the popped ids leave it
-- KEYS[26] cancel hash: ids of cancelled ready jobs (cancel.lua); a popped one is
--          dropped (never reserved nor run) and counted in stats "cancelled" (a tracked
--          one is settled as cancelled in its campaign); its value "q": the cancel gave
--          its group's quota count back already (else this drop does); "x"/"k": an
--          expired job (KEYS[42]); "X": a job dropped as expired, kept an hour for its
--          status (a "~<id>" member of KEYS[42] scored then removes it)
-- KEYS[27] done: prefix of the per-job channels; a job dead-lettered here is announced
--          on "<done>:<id>" with "d", one dropped as expired with "x"
-- KEYS[28] seq counter; KEYS[29..32] waiting bitmaps, slots 0..3 (enqueue.lua): a popped
--          job's bit is cleared (per run of consecutive sequence numbers, as a FIFO pop
--          takes them: one command a run (set_bits); ids without a sequence number: none)
-- KEYS[33] gready zset, KEYS[34] groups zset, KEYS[35] gwait zset, KEYS[36] gstate
--          hash, KEYS[37] limits hash: flow control (_groups.lua). Grouped jobs
--          are promoted, reaped and popped through their group; groups are served in
--          turn (lowest virtual time first, weighted), each within its rate and
--          concurrency limits; a group out of tokens or slots waits in gwait and is not
--          looked at again until its next token (or a freed slot) is due; one
--          outside its send window or past a calendar quota waits there until the
--          window opens or the period ends (_windows.lua: boundary lists in limits,
--          counts in gstate "<g>|<m|h|d|M>")
-- KEYS[38] idle zset: the hand-off registrations (enqueue.lua)
-- KEYS[39] bundles zset: leases of bundles (_bundles.lua), reaped like reserved
-- KEYS[40] evconf hash, KEYS[41] events stream: when events are on, "started" per job
--          returned (a bundle's too), "dead" per job dead-lettered here (reaped or
--          malformed), "cancelled" per job of a cancelled campaign dropped (a job
--          cancelled by cancel.lua has its event there) (_events.lua)
-- KEYS[42] expires zset: deadlines of jobs with an expiry (_expiry.lua); the due ones
--          get an expired tombstone in the cancel hash ("x", or "k": kept in dead,
--          reason "expired"), and such a job popped is dropped like a cancelled one,
--          counted in stats "expired" (settled as expired in its campaign)
-- ARGV[1]  how many jobs to pop (0 = maintenance only)
-- ARGV[2]  lease in ms
-- ARGV[3]  chunk: at most this many delayed and expired jobs are moved per call
-- ARGV[4]  "<lease ms>|<worker>" or "": when this pop returns no job, the worker is
--          registered in idle until now + ARGV[5] ms (it is about to block on the wake
--          list: enqueue.lua may hand it a leased job); when it returns jobs, its
--          registration goes. Before popping, jobs handed off but still on the wake
--          list (their worker went away, or another took the wake-up) are claimed
--          as they are: they are leased already
-- ARGV[5]  ms an idle worker's hand-off registration lasts (with ARGV[4])
-- ARGV[6]  "1": lease the jobs of this pop as one bundle (_bundles.lua; tracked jobs
--          too: settled by id wherever a bundle job ends) when it takes no grouped
--          job, the queue has no concurrency limit and no job of the queue has crash
--          marks; their running jobs are counted in stats "bundled" (bundle_done)
-- ARGV[7]  at most this many cancelled entries are dropped per call beyond the jobs
--          it asked for: a dropped entry counts against nothing (not ARGV[1], a rate
--          token, a concurrency slot, a quota), the call pops on in its place. A call
--          that dropped jobs and comes back short leaves a wake token, so a worker pops
--          again at once (absent: 0, one round of drops)
--
-- Crash marks. An expired lease means its worker died or stalled; the script cannot
-- know which of that worker's jobs was running. So the job goes back with its attempt
-- refunded (max_attempts + 1: each run keeps its own lease name) and is marked
-- recovered. A job recovered ISOLATE_AFTER times (held by that many dead workers: few
-- innocent jobs are) comes back flagged, and the worker that pops it runs it alone and
-- first records that its handler started (start.lua). An expired lease WITH that
-- mark is charged: the attempt stays used and the crash is counted; when it was the
-- last attempt the job is dead-lettered as crashed_worker. Marks go at ack, nack and
-- here at dead-lettering.
--
-- Returns {now_ms, next_due_ms or -1 (the earliest delayed job, rate token or hold end),
--          next_deadline_ms or -1, promoted, reaped,
--          expired (dead-lettered: lease_expired), malformed (dead-lettered:
--          decode_error), crashed (dead-lettered: crashed_worker), {positions (1-based,
--          among the jobs) of jobs to run alone}, {ids of campaigns that became due:
--          the worker tries to complete them}, {bundle name, n} or {}, job, job,
--          ...}; each job is the entry with its attempt counted, but for the last n,
--          the jobs of the bundle, which are as they were popped (their attempt is
--          counted by the worker; their leases are the name and the position, 1..n,
--          in two bytes: _bundles.lua).
--
-- The phases are named functions of the library (_pop_reap.lua, _pop_reserve.lua,
-- _pop_groups.lua, _pop_reply.lua), run below in order on one context c: the state
-- the phases hand on. Each phase names the keys it uses in its first lines (locals:
-- a key costs a call no allocation).
-- LMPOP (Redis 7.0+: one command for the first non-empty ready list)
local LMPOP = (tonumber(redis.REDIS_VERSION_NUM) or 0) >= 0x070000

local c = {
  now = now_ms(),
  want = tonumber(ARGV[1]),  -- jobs still wanted (claims and pops count it down)
  lmpop = LMPOP,  -- false once an ACL refuses it
  -- what the upkeep did (the reply's counts) and left for the pop
  promoted = 0, reaped = 0, buried = 0, crashed = 0,
  ok = true,  -- false: a full Redis refused a write, the rest of the upkeep waits
  woken = {},  -- groups that got ready jobs
  due = {},  -- ids of campaigns that became due (the reply's 10th item)
  marks = {},  -- positions of the jobs to run alone (the reply's 9th item)
  flow = -1,  -- the earliest time a throttled queue or group may start jobs again
  claimed = false,  -- jobs handed off were claimed
  wake_empty = false,  -- this call emptied the wake list (a token needs no LLEN)
  -- set by the phases (named here so the table is sized once: no rehash in a call)
  want0 = 0, first_due = false, first_lease = false, bnext = -1, quiet = false,
  out = false, header_n = 0,
  -- the reserve's (begin_reserve, queue_limit, pick_groups; _pop_reserve.lua)
  deadline = 0, hargs = false, zargs = false, ids = false, dropped = 0,
  seqs = false, bund = false, ndrop = 0, nexp = 0, expiring = false,
  any_tombstones = false, any_pending = false, any_cancelled = false,
  asked = 0, sel = false, plain = 0, bundling = false, added = false, btracked = false,
  -- nil until known: job events (read by the reaper when it buries a job, else told by
  -- read_quiet's EXISTS: no command more), any_recovered (read_flags)
  -- nil until needed (not in the table a plain call builds, so it keeps to fewer
  -- slots): what the reaper and the drops collect (gone, t_dead, g_back, g_dead;
  -- g_gone, flags, skipped, xids, tomb_del, known), the groups' lanes (lanes,
  -- lane_group), the queue's limit and tokens (qlim, qtok) and its quotas and windows
  -- (cal, calc, qcal: _windows.lua)
}
c.want0 = c.want

-- 1. due delayed jobs -> ready; 2. expired leases and bundles -> ready head, or dead
promote_due(c)
reap_leases(c)
reap_bundles(c)
settle_reaped(c)

-- what the queue has (one EXISTS on a plain queue); groups due rejoin the rotation
read_quiet(c)
wake_groups(c)
expire_due(c)  -- jobs past their deadline get their tombstones (_expiry.lua)

-- 3. pop and reserve
c.out = {c.now, -1, -1, c.promoted, c.reaped, c.buried, 0, c.crashed, c.marks, c.due, {}}
c.header_n = #c.out
claim_handoffs(c)
local paused = KEYS[7]
if c.want > 0 and (c.quiet or redis.call('EXISTS', paused) == 0) then
  begin_reserve(c)
  queue_limit(c)       -- the whole queue's hold and limits cut c.want
  pick_groups(c)       -- the groups looked at, the plain lists' share, bundling
  pop_plain(c)         -- the ready lists (screened: cancelled jobs dropped)
  pop_groups(c)        -- each group within its limits, in turn
  reserve_in_turns(c)  -- the groups' jobs, alternating between them
  lease_jobs(c)        -- the bundle or the leases of their own, written
  settle_dropped(c)    -- the jobs dropped: counted, settled, out of their quota
  if (c.want <= 0 and c.asked > 0) or (c.ndrop > 0 and c.want > 0) then
    -- a full batch: more may be waiting, let the next idle worker look; or a call that
    -- dropped jobs and came back short (its drop budget spent, or groups it did not
    -- look at): a worker pops again at once rather than idle while jobs are ready
    wake_token(c)
  end
end
if c.claimed then
  -- the workers blocked for those jobs may be needed for what else is ready
  wake_token(c)
end

-- the reply: idle registration, next due time, "started" events, next lease deadline
finish_reply(c)
return c.out
