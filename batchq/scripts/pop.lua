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
--          dedup:exp zset: tracked jobs (ids ending "_m", _lib.lua) reaped dead are
--          settled; a popped job of a campaign cancelled on this queue is not reserved:
--          it is dropped and counted cancelled (in its campaign and in stats
--          "cancelled")
-- KEYS[25] pending hash: id -> "r" | delayed entry (see enqueue.lua); kept in step with
--          every move below, and the popped ids leave it
-- KEYS[26] cancel hash: ids of cancelled ready jobs (cancel.lua); a popped one is
--          dropped (never reserved nor run) and counted in stats "cancelled" (a tracked
--          one is settled as cancelled in its campaign); its value "q": the cancel gave
--          its group's quota count back already (else this drop does)
-- KEYS[27] done: prefix of the per-job channels; a job dead-lettered here is announced
--          on "<done>:<id>" with "d"
-- KEYS[28] seq counter; KEYS[29..32] waiting bitmaps, slots 0..3 (enqueue.lua): a popped
--          job's bit is cleared (per run of consecutive sequence numbers, as a FIFO pop
--          takes them: one command a run (set_bits); ids without a sequence number: none)
-- KEYS[33] gready zset, KEYS[34] groups zset, KEYS[35] gwait zset, KEYS[36] gstate
--          hash, KEYS[37] limits hash: flow control (_lib.lua "Groups"). Grouped jobs
--          are promoted, reaped and popped through their group; groups are served in
--          turn (lowest virtual time first, weighted), each within its rate and
--          concurrency limits; a group out of tokens or slots waits in gwait and is not
--          looked at again until its next token (or a freed slot) is due
-- KEYS[38] idle zset: the hand-off registrations (enqueue.lua)
-- KEYS[39] bundles zset: leases of bundles (_lib.lua "Bundles"), reaped like reserved
-- KEYS[40] evconf hash, KEYS[41] events stream: when events are on, "started" per job
--          returned (a bundle's too), "dead" per job dead-lettered here (reaped or
--          malformed), "cancelled" per job of a cancelled campaign dropped (a job
--          cancelled by cancel.lua has its event there) (_lib.lua "Job events")
-- ARGV[1]  how many jobs to pop (0 = maintenance only)
-- ARGV[2]  lease in ms
-- ARGV[3]  chunk: at most this many delayed and expired jobs are moved per call
-- ARGV[4]  "<lease ms>|<worker>" or "": when this pop returns no job, the worker is
--          registered in idle until now + ARGV[5] ms (it is about to block on the wake
--          list: enqueue.lua may hand it a leased job); when it returns jobs, its
--          registration goes. Before popping, jobs handed off but still on the wake
--          list (their worker went away, or another took the wake-up) are claimed
--          as they are: they are leased already
-- ARGV[6]  "1": lease the plain jobs of this pop as one bundle (_lib.lua "Bundles")
--          when it takes no grouped job, the queue has no concurrency limit and no
--          job of the queue has crash marks; their running jobs are counted in stats
--          "bundled" (bundle_done)
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
--          in two bytes: _lib.lua "Bundles").
local delayed = KEYS[1]
local reserved = KEYS[2]
local inflight = KEYS[3]
local dead = KEYS[4]
local dead_jobs = KEYS[5]
local wake = KEYS[6]
local paused = KEYS[7]
local READY9 = 8  -- KEYS[READY9 + 9 - p] is the ready list of priority p
local stats = KEYS[18]
local recovered = KEYS[19]
local started = KEYS[20]
local campaigns = KEYS[21]
local jobmeta = KEYS[22]
local dedup = KEYS[23]
local dedup_exp = KEYS[24]
local pending = KEYS[25]
local cancel = KEYS[26]
local done = KEYS[27]
local seq = KEYS[28]
local WAIT0 = 29  -- KEYS[WAIT0 + s] is the bitmap of slot s (0..3)
local gready = KEYS[33]
local groups = KEYS[34]
local gwait = KEYS[35]
local gstate = KEYS[36]
local limits = KEYS[37]
local idle = KEYS[38]
local bundles = KEYS[39]
local evconf = KEYS[40]
local events = KEYS[41]

local QUANTUM = 10  -- jobs a group (of weight 1) may start in one turn
-- LMPOP (Redis 7.0+: one command for the first non-empty ready list)
local LMPOP = (tonumber(redis.REDIS_VERSION_NUM) or 0) >= 0x070000
local byte, sub, find = string.byte, string.sub, string.find
local ISOLATE_AFTER = 2  -- recoveries after which a job runs alone, its start recorded

local now = now_ms()
local want = tonumber(ARGV[1])
local lease = tonumber(ARGV[2])
local chunk = tonumber(ARGV[3])
local drop_max = tonumber(ARGV[7]) or 0
-- job events: nil until known, read by the reaper when it buries a job, else told by
-- the quiet check's EXISTS below (no command more)
local ev

local function ready_key(p)
  return KEYS[READY9 + 9 - p]
end

-- Each zset of due work (delayed, reserved, bundles) is read by its earliest entry
-- first, and its due entries only when that one is due; when nothing was taken from it,
-- that entry is the reply's next time too (this script never adds to delayed, and knows
-- its own leases' deadline). A redis.call costs a pop about what a bundled job does.

-- 1. due delayed jobs -> ready (write before delete; on a full Redis the first write may
--    be refused: then nothing moves this time, and the pop below still runs)
local first_due = redis.call('ZRANGE', delayed, 0, 0, 'WITHSCORES')
local due = {}
if first_due[2] and tonumber(first_due[2]) <= now then
  due = redis.call('ZRANGEBYSCORE', delayed, '-inf', now, 'LIMIT', 0, chunk)
end
local moved = {}
local woken = {}  -- groups that got ready jobs
for _, e in ipairs(due) do
  local p = tonumber(string.sub(e, 1, 1)) or 0
  local _, _, _, id = parse(e)
  local g = id and string.find(id, '~', 1, true) and group_of(id)
  if g then
    if not gpush(gready, gstate, {{g, p, e}}, false) then break end
    woken[g] = true
  elseif not try_rpush(ready_key(p), e) then
    break
  end
  moved[#moved + 1] = e
end
if #moved > 0 then
  redis.call('ZREM', delayed, unpack(moved))
  local marks = {}
  for _, e in ipairs(moved) do
    local _, _, _, id = parse(e)
    if id then
      marks[#marks + 1] = id
      marks[#marks + 1] = 'r'
    end
  end
  index_pending(pending, marks)
end

-- 2. expired reservations -> ready head (latest first, so the earliest ends up in
--    front), or dead
local reaped, buried, crashed = 0, 0, 0
local first_lease = redis.call('ZRANGE', reserved, 0, 0, 'WITHSCORES')
local expired = {}
if first_lease[2] and tonumber(first_lease[2]) <= now then
  expired = redis.call('ZRANGEBYSCORE', reserved, '-inf', now, 'LIMIT', 0, chunk)
end
local gone = {}
local t_dead = {}  -- tracked jobs reaped dead
local g_back, g_dead = {}, {}  -- grouped jobs reaped: back in their group, or dead

-- back to the head of its ready list, or of its group
local function push_head(id, p, e)
  local g = string.find(id, '~', 1, true) and group_of(id)
  if not g then return try_lpush(ready_key(p), e) end
  woken[g] = true
  return gpush(gready, gstate, {{g, p, e}}, true)
end
-- one expired job (its lease m, id, in-flight entry e): back to the head of its list
-- with its attempt refunded, or dead; false when a full Redis refused the write
local function reap(m, id, e)
  local ok = true
  local p, a, mx, _, hl = parse(e)
  local rec = redis.call('HGET', recovered, id)
  local n, c = 0, 0
  if rec then
    local sn, sc = string.match(rec, '^(%d+):(%d+)$')
    n, c = tonumber(sn) or 0, tonumber(sc) or 0
  end
  local charged = p and redis.call('HGET', started, id) == m
  if not p then
    -- a malformed in-flight entry (written by hand): nothing can run it
    ok = try_hset(dead_jobs, id, dead_record(id, 'lease_expired',
      'the lease of a malformed entry expired', e))
    if ok then
      redis.call('ZADD', dead, now, id)
      redis.call('PUBLISH', done .. ':' .. id, 'd')
      if ev == nil then ev = ev_open(evconf) end
      ev_entry(events, ev, now, 'dead', nil, 0, 'lease_expired', jobmeta, id)
      buried = buried + 1
      if tracked(id) then t_dead[#t_dead + 1] = id end
    end
  elseif charged and a >= mx then
    ok = try_hset(dead_jobs, id, dead_record(id, 'crashed_worker',
      'its worker died (or stalled past its lease) while running it, ' .. (c + 1)
      .. ' times; ' .. (n + 1) .. ' workers died holding it', e))
    if ok then
      if ev == nil then ev = ev_open(evconf) end
      ev_entry(events, ev, now, 'dead', e, 0, 'crashed_worker', jobmeta, id)
      redis.call('ZADD', dead, now, id)
      redis.call('HDEL', recovered, id)
      redis.call('PUBLISH', done .. ':' .. id, 'd')
      crashed = crashed + 1
      if tracked(id) then t_dead[#t_dead + 1] = id end
    end
  else
    if charged then
      c = c + 1
    else
      -- not known to have started: an innocent neighbour, its attempt refunded by
      -- raising max_attempts (not by lowering attempt: the next run must hold a new
      -- lease name, or a late ack of this one would finish it)
      e = with_attempt(e, p, a, mx + 1, id, hl)
    end
    ok = push_head(id, p, e)
    if ok then
      redis.call('HSET', recovered, id, (n + 1) .. ':' .. c)
      redis.call('HSET', pending, id, 'r')
      reaped = reaped + 1
      g_back[#g_back + 1] = id
    end
  end
  if ok and g_back[#g_back] ~= id then g_dead[#g_dead + 1] = id end
  return ok
end
local ok = true
for x = #expired, 1, -1 do
  local m = expired[x]
  local id = member_id(m)
  local e = id and redis.call('HGET', inflight, id)
  if e then
    ok = reap(m, id, e)
    if not ok then break end  -- refused (full Redis): the rest stay until later
    -- a job handed off (enqueue.lua) that nobody took is on the wake list still: it
    -- goes, or a late BLPOP would run it beside its reaped copy
    redis.call('LREM', wake, 1, e)
    redis.call('HDEL', started, id)
    redis.call('HDEL', inflight, id)
  end
  gone[#gone + 1] = m
end
-- expired bundles: each running job as if it had a lease of its own, latest first.
-- The earliest deadline first (one entry: the reply's next deadline when it is not
-- due, as it is in nearly every call); only when it is due, the expired ones (at most
-- chunk). A range over every live bundle would read one entry per pop in flight
local bexp, bnext = {}, -1
local bz = redis.call('ZRANGE', bundles, 0, 0, 'WITHSCORES')
if bz[2] and tonumber(bz[2]) <= now and ok then
  bexp = redis.call('ZRANGEBYSCORE', bundles, '-inf', now, 'LIMIT', 0, chunk)
  bz = redis.call('ZRANGE', bundles, #bexp, #bexp, 'WITHSCORES')
end
if bz[2] then bnext = tonumber(bz[2]) end
local met, orphans = {}, {}  -- bundles read (bundle_state); members without fields
for x = #bexp, 1, -1 do
  local b = bexp[x]
  local bd = bundle_state(inflight, met, b)
  if not bd then orphans[#orphans + 1] = b end
  for pos = bd and #bd[2] or 0, 1, -1 do
    local id, e = bundle_job(bd, pos)
    if id then
      ok = reap(b .. string.char(math.floor(pos / 256), pos % 256), id, e)
      if not ok then
        bd[2][pos] = 48  -- still running: the bundle stays until later
        bd[3] = bd[3] - 1
        break
      end
    end
  end
  if not ok then
    bnext = now  -- refused (full Redis): this bundle stays, expired
    break
  end
end
if #met > 0 then
  bundle_done(bundles, inflight, stats, met)
  unpin(inflight)
end
if #orphans > 0 then redis.call('ZREM', bundles, unpack(orphans)) end
if #gone > 0 then
  redis.call('ZREM', reserved, unpack(gone))
  unpin(inflight)
end
if buried + crashed > 0 then
  redis.call('HINCRBY', stats, 'dead', buried + crashed)
end
gsettle(gstate, gwait, wake, g_back, false)
gsettle(gstate, gwait, wake, g_dead, true)
local due = {}
if #t_dead > 0 then
  settle_tracked(campaigns, jobmeta, dedup, dedup_exp, t_dead, 'd', now, due)
end
if #moved > 0 or reaped > 0 then
  leave_wake_token(wake)
end

-- A plain queue's pop: one EXISTS says that none of these is there (not paused, no
-- crash marks, cancelled or pending jobs, limits, groups or waits), and the reads each
-- would need are skipped; with any of them there, each is read as it is needed. The
-- events config is named 8 times: EXISTS counts each mention, so the reply says both
-- (count % 8: the others; >= 8: events on)
local quiet = next(woken) == nil and redis.call('EXISTS', paused, recovered, cancel,
  pending, limits, groups, gwait, evconf, evconf, evconf, evconf, evconf,
  evconf, evconf, evconf)
if ev == nil then ev = (not quiet or quiet >= 8) and ev_open(evconf) end
quiet = quiet and quiet % 8 == 0

-- 2b. groups whose wait is over (a token due, a hold ended, a slot freed) and groups
--     that just got ready jobs join the rotation
local over = quiet and {}
  or redis.call('ZRANGEBYSCORE', gwait, '-inf', now, 'LIMIT', 0, chunk)
if #over > 0 then
  redis.call('ZREM', gwait, unpack(over))
  for _, g in ipairs(over) do
    if g ~= QUEUE then woken[g] = true end
  end
end
for g in pairs(woken) do gwake(groups, gwait, gstate, g) end

-- 3. pop and reserve
local marks = {}
local out = {now, -1, -1, #moved, reaped, buried, 0, crashed, marks, due, {}}
local header_n = #out
local flow = -1  -- the earliest time a throttled queue or group may start jobs again
local function soon(t)
  if flow < 0 or t < flow then flow = t end
end
local want0 = want
local claimed = false
local wake_empty = false  -- this call emptied the wake list (a token needs no LLEN)
local function token()
  if wake_empty then
    redis.pcall('RPUSH', wake, '1')
    wake_empty = false
  else
    leave_wake_token(wake)
  end
end
local added  -- the deadline of the leases of their own this call adds to reserved
if want > 0 then
  -- jobs handed off (leased by enqueue.lua) that no blocked worker has taken: this
  -- pop takes them as they are; wake tokens popped with them are spent by this pop
  local w = redis.call('LPOP', wake, want)
  wake_empty = not w or #w < want
  if w then
    for _, v in ipairs(w) do
      if v ~= '1' then
        out[#out + 1] = v
        want = want - 1
        claimed = true
      end
    end
  end
end
if want > 0 and (quiet or redis.call('EXISTS', paused) == 0) then
  local deadline = now + lease
  local hargs, zargs, ids = {}, {}, {}
  local dropped = 0
  local g_gone = {}  -- grouped jobs dropped here: they leave their group's quota count
  -- read once, when the first job is taken (an empty pop reads none of them):
  -- recovered jobs, cancelled ones, and tracked jobs (only while a campaign is
  -- cancelled on this queue, "~cancelled" > 0, is each one's campaign flag looked up,
  -- to drop it; otherwise they cost nothing here)
  local any_recovered, any_tombstones, any_cancelled, any_pending
  local flags, skipped = {}, {}
  local seqs = {}  -- the sequence numbers of the jobs popped (their waiting bits)
  -- the plain jobs of a pop without groups and without a queue concurrency limit are
  -- leased as one bundle (ARGV[6], _lib.lua "Bundles"), unless some job of the queue
  -- has crash marks (a recovered job must be leased, and maybe run, alone)
  local bundling, bund = false, {}

  -- one popped entry: reserved (true), or dropped (cancelled, malformed)
  local function read_flags()
    if any_recovered == nil then
      any_recovered = not quiet and redis.call('HLEN', recovered) > 0
      any_tombstones = not quiet and redis.call('HLEN', cancel) > 0
      any_pending = not quiet and redis.call('HLEN', pending) > 0
      any_cancelled = tonumber(redis.call('HGET', campaigns, '~cancelled') or '0') > 0
    end
  end
  local function popped(id)
    ids[#ids + 1] = id
    local q = seq_of(id)
    if q then seqs[#seqs + 1] = q end
  end
  -- Popped entries es[1..] screened in order: a cancelled one is dropped (never reserved
  -- nor run; counted, settled), a malformed one buried, the others returned as {entry,
  -- nil, nil, id, position in es} (reserve's priority and attempt: parsed when leased),
  -- at most `limit` of them (nil: all); also how many entries were used (the rest are
  -- left as they are).
  -- The lookups are read-only and batched: one HMGET of the cancel hash while it has
  -- tombstones, one of jobmeta for the tracked jobs while a campaign is cancelled here.
  -- A cancelled one costs the call nothing it counts: no rate token, slot, quota or
  -- share of `want`.
  local ndrop = 0  -- cancelled entries dropped by this call
  local tomb_del = {}  -- their tombstones, deleted at the end of the call
  local known = {}  -- id -> jobmeta entry of the campaign jobs dropped (settle_tracked)
  local function screen(es, limit)
    read_flags()
    local n = #es
    local idl = {}  -- the ids (header_id: one capture; a live job's header is parsed
    for i = 1, n do  -- when it is leased, a dropped one's never)
      idl[i] = header_id(es[i]) or false
    end
    local tomb, meta = {}, {}
    local function lookup(key, want_it, into)
      local q, qi = {}, {}
      for i = 1, n do
        if idl[i] and want_it(i) then
          q[#q + 1] = idl[i]
          qi[#qi + 1] = i
        end
      end
      if #q == 0 then return end
      local v = redis.call('HMGET', key, unpack(q))
      for j, i in ipairs(qi) do into[i] = v[j] end
    end
    if any_tombstones then lookup(cancel, function() return true end, tomb) end
    if any_cancelled then
      lookup(jobmeta, function(i) return not tomb[i] and tracked(idl[i]) end, meta)
    end
    local live, used = {}, 0
    for i = 1, n do
      if limit and #live >= limit then break end
      used = i
      local e, id, t, v = es[i], idl[i], tomb[i], meta[i]
      local cid = v and string.match(v, '^([^\n]*)\n') or ''
      if cid ~= '' and flags[cid] == nil then
        flags[cid] = redis.call('HGET', campaigns, cid .. ':f') or ''
      end
      if not id then
        -- each malformed entry keeps its own record, even identical ones
        local nth = redis.call('HINCRBY', stats, 'malformed', 1)
        bury(dead, dead_jobs, now,
          'raw-' .. string.sub(redis.sha1hex(e), 1, 20) .. '-' .. nth,
          'decode_error', 'malformed job header', e)
        ev_entry(events, ev, now, 'dead', nil, 0, 'decode_error', jobmeta, '')
        out[7] = out[7] + 1
      elseif t then
        -- cancelled while it waited (cancel.lua): dropped; "q": its group's quota count
        -- was given back by the cancel itself
        tomb_del[#tomb_del + 1] = id
        dropped = dropped + 1
        ndrop = ndrop + 1
        if tracked(id) then skipped[#skipped + 1] = id end
        if t ~= 'q' then g_gone[#g_gone + 1] = id end
      elseif cid ~= '' and flags[cid] == 'cancelled' then
        -- of a campaign cancelled on this queue: dropped
        dropped = dropped + 1
        ndrop = ndrop + 1
        skipped[#skipped + 1] = id
        known[id] = v
        ev_entry(events, ev, now, 'cancelled', e, 0, 'campaign cancelled', jobmeta, id)
        popped(id)  -- popped: leaves the pending index and its bitmap
        g_gone[#g_gone + 1] = id
      else
        live[#live + 1] = {e, nil, nil, id, i}
      end
    end
    return live, used
  end
  -- a screened entry reserved (leased, or added to the bundle)
  local function reserve(e, p, a, id)
    popped(id)
    if bundling and not any_recovered and not tracked(id) then
      bund[#bund + 1] = e  -- as popped: the worker counts the attempt
      return
    end
    local _, r, lease_name = count_attempt(e, p, a, id)
    hargs[#hargs + 1] = id
    hargs[#hargs + 1] = r
    zargs[#zargs + 1] = deadline
    zargs[#zargs + 1] = lease_name
    out[#out + 1] = r
    local rec = any_recovered and redis.call('HGET', recovered, id)
    if rec and (tonumber(string.match(rec, '^(%d+)')) or 0) >= ISOLATE_AFTER then
      marks[#marks + 1] = #out - header_n
    end
  end
  local function take(es)
    for _, x in ipairs((screen(es))) do reserve(x[1], x[2], x[3], x[4]) end
  end

  -- the whole queue: a hold (RateLimited without a group), then its own limit
  local held = quiet and 0 or tonumber(redis.call('ZSCORE', gwait, QUEUE) or '0')
  if held > now then
    soon(held)
    want = 0
  end
  local qlim = want > 0 and not quiet and limit_of(redis.call('HGET', limits, QUEUE))
  local qtok
  if qlim then
    if qlim.conc then
      -- jobs running: leases of their own, and the running jobs of bundles
      local free = qlim.conc - redis.call('ZCARD', reserved)
        - (tonumber(redis.call('HGET', stats, 'bundled')) or 0)
      if free <= 0 then redis.call('HSET', gstate, QUEUE .. ':blk', 1) end
      want = math.min(want, free)
    end
    if qlim.rate and want > 0 then
      qtok = tokens(gstate, QUEUE, qlim, now)
      if qtok < 1 then soon(next_token(qtok, qlim, now, want)) end
      want = math.min(want, math.floor(qtok))
    end
  end
  local asked = math.max(want, 0)

  -- groups in turn: the plain lists count as one more participant
  -- (a turn is up to QUANTUM jobs per unit of weight: a call looks at twice as many
  -- groups as it can serve, in case some are throttled or out of work)
  local looked = math.min(want, 2 * math.ceil(want / QUANTUM))
  local sel = want > 0 and not quiet
    and redis.call('ZRANGE', groups, 0, looked - 1, 'WITHSCORES') or {}
  local plain = want
  bundling = ARGV[6] == '1' and #sel == 0 and not (qlim and qlim.conc)
  if #sel > 0 then
    -- the plain lists take one participant's share, and when there is less than one
    -- job for each, their turn comes once per round like a group's (a pop counter)
    local parts = #sel / 2 + 1
    plain = math.floor(want / parts)
    if plain == 0 and redis.call('HINCRBY', gstate, 'pturn', 1) % parts == 0 then
      plain = 1
    end
  end
  -- what each participant gets this call, taken in turns below (one job each per turn)
  local lanes, lane_group = {{}}, {false}
  -- how many of the ten ready lists hold jobs (one command: an empty pop, the idle
  -- worker's, makes no LPOP at all, and none is made below the last non-empty list);
  -- with LMPOP, an empty reply says the same in the one command
  local function count_ready()
    return redis.call('EXISTS', ready_key(9), ready_key(8), ready_key(7), ready_key(6),
      ready_key(5), ready_key(4), ready_key(3), ready_key(2), ready_key(1), ready_key(0))
  end
  local nonempty = 0
  if plain > 0 then nonempty = LMPOP and 10 or count_ready() end
  -- highest priority first: LMPOP takes from the first non-empty list in one command
  -- (Redis 7.0+); before 7.0, LPOP each list in turn (p: the next one)
  -- Cancelled entries dropped do not count against `plain`/`want`: the loop
  -- pops again in their place, until the call has dropped ARGV[7] of them in all.
  local p = 9
  while plain > 0 and nonempty > 0 and p >= 0 and (ndrop == 0 or ndrop < drop_max) do
    local items
    local ask = plain
    if LMPOP then
      -- the lists above the one it takes from are empty, and that one is emptied
      -- unless the call has all it wants: the next call asks all ten again
      local got = redis.pcall('LMPOP', 10, ready_key(9), ready_key(8), ready_key(7),
        ready_key(6), ready_key(5), ready_key(4), ready_key(3), ready_key(2), ready_key(1),
        ready_key(0), 'LEFT', 'COUNT', ask)
      if type(got) == 'table' and got.err then
        -- refused (an ACL user without +lmpop): as before 7.0
        LMPOP = false
        nonempty = count_ready()
      elseif not got then
        break
      else
        items = got[2]
      end
    else
      items = redis.call('LPOP', ready_key(p), ask)
      -- a list that gave all it was asked may hold more (asked again after drops)
      if not items or #items < ask then p = p - 1 end
    end
    if items then
      if #items < ask then nonempty = nonempty - 1 end
      local d0 = ndrop
      if #sel == 0 then  -- no groups: no turns to take
        read_flags()
        if bundling and not any_recovered and not any_tombstones then
          -- a bundle's plain jobs (the common case) inline, anything else through take:
          -- the header matched by positions (no string made), the id's sequence number
          -- read from the entry (seq_of's rule: "-" after 17 characters, then hex), the
          -- id itself made only while the pending index has entries
          local nb, ns = #bund, #seqs
          local slow, slot = {}, {}  -- entries left to screen, their places in bund
          for _, e in ipairs(items) do
            local _, _, a, z = find(e, '^%d:%d+:%d+:()[^:]+():')
            -- a <= 18: attempt and max_attempts short (header_id); not tracked ("_m")
            if a and a <= 18 and not (byte(e, z - 2) == 95 and byte(e, z - 1) == 109) then
              nb = nb + 1
              bund[nb] = e
              if byte(e, a + 17) == 45 then
                local q = tonumber(sub(e, a + 18, z - 1), 16)
                if q then
                  ns = ns + 1
                  seqs[ns] = q
                end
              end
              if any_pending then ids[#ids + 1] = sub(e, a, z - 1) end
            else
              nb = nb + 1
              bund[nb] = false  -- its place, if it is bundled
              slow[#slow + 1] = e
              slot[#slow] = nb
            end
          end
          if #slow > 0 then
            -- screened together; a plain one keeps its place in the bundle, a tracked one
            -- has a lease of its own, a dropped one's place goes
            for _, x in ipairs((screen(slow))) do
              if tracked(x[4]) then
                reserve(x[1], x[2], x[3], x[4])
              else
                bund[slot[x[5]]] = x[1]
                popped(x[4])
              end
            end
            local j = 0
            for i = 1, nb do
              if bund[i] then
                j = j + 1
                bund[j] = bund[i]
              end
            end
            for i = j + 1, nb do bund[i] = nil end
          end
        else
          take(items)
        end
      else
        local lane = lanes[1]
        for _, x in ipairs((screen(items))) do lane[#lane + 1] = x end
      end
      plain = plain - (#items - (ndrop - d0))
      want = want - (#items - (ndrop - d0))
    end
  end
  if #sel > 0 and want > 0 then
    local names = {}
    for i = 1, #sel, 2 do names[#names + 1] = sel[i] end
    local lims = redis.call('HMGET', limits, '*', unpack(names))
    local deflim = limit_of(lims[1])
    local gl, sumw = {}, 0
    for i, g in ipairs(names) do
      gl[i] = limit_of(lims[i + 1]) or deflim
      sumw = sumw + (gl[i] and gl[i].weight or 1)
    end
    local budget = want
    local vts = {}
    local last_vt
    for i, g in ipairs(names) do
      if want <= 0 then break end
      local lim, w = gl[i], gl[i] and gl[i].weight or 1
      local n = math.min(want, math.max(math.ceil(QUANTUM * w),
                                        math.floor(budget * w / sumw + 0.5)))
      local why  -- the group cannot start more now: BLOCKED (no slot), or when to look again
      if lim and lim.conc then
        local run = tonumber(redis.call('HGET', gstate, g .. ':run') or '0')
        if run + n > lim.conc then n = lim.conc - run end
        if n <= 0 then why = BLOCKED end
      end
      local gtok
      if lim and lim.rate and n > 0 then
        gtok = tokens(gstate, g, lim, now)
        if gtok < 1 then why = next_token(gtok, lim, now, QUANTUM * w) end
        n = math.min(n, math.floor(gtok))
      end
      if n > 0 then
        local lo, hi = grange(g)
        -- the group's first jobs, screened as they are read: dropped ones do not count
        -- against n, the group reads on in their place (a read grows with the drops:
        -- few calls per ARGV[7] dropped) while the call may drop more
        local lane, got, gdrop, more, ask = {}, 0, 0, true, n
        while got < n and more and (gdrop == 0 or ndrop < drop_max) do
          local items = redis.call('ZRANGEBYLEX', gready, lo, hi, 'LIMIT', 0, ask + 1)
          local es = {}
          for j = 1, math.min(ask, #items) do es[j] = gentry(items[j]) end
          local d0 = ndrop
          local live, used = screen(es, n - got)
          for _, x in ipairs(live) do
            got = got + 1
            lane[got] = x
          end
          gdrop = gdrop + ndrop - d0
          if used > 0 then
            -- the jobs read are the group's first ones: one range delete, not one each
            redis.call('ZREMRANGEBYLEX', gready, lo, '[' .. items[used])
          end
          more = #items > used
          ask = n - got + math.min(gdrop, math.max(0, drop_max - ndrop), 1000)
        end
        lanes[#lanes + 1] = lane
        lane_group[#lanes] = g
        want = want - got
        if gtok then take_tokens(gstate, g, gtok - got, now) end
        last_vt = tonumber(sel[2 * i]) + got / w
        if not more then
          redis.call('ZREM', groups, g)  -- no ready jobs left
        else
          vts[#vts + 1] = last_vt
          vts[#vts + 1] = g
        end
      end
      if why then
        redis.call('ZREM', groups, g)
        redis.call('ZADD', gwait, why, g)
        if why < BLOCKED then soon(why) end
      end
    end
    if #vts > 0 then redis.call('ZADD', groups, unpack(vts)) end
    if last_vt then redis.call('HSET', gstate, 'vt', last_vt) end
  end
  -- reserve in turns, so a batch alternates between the groups (and the plain lists)
  local running, run_order = {}, {}
  local turns = 0
  for _, lane in ipairs(lanes) do turns = math.max(turns, #lane) end
  for j = 1, (#sel > 0 and turns or 0) do
    for i, lane in ipairs(lanes) do
      local x = lane[j]
      if x then
        reserve(x[1], x[2], x[3], x[4])
        local g = lane_group[i]
        if g then
          if not running[g] then run_order[#run_order + 1] = g; running[g] = 0 end
          running[g] = running[g] + 1
        end
      end
    end
  end
  gadd(gstate, run_order, running, ':run')
  if qtok and asked > want then take_tokens(gstate, QUEUE, qtok - (asked - want), now) end

  if #bund == 1 then
    -- one job: a lease of its own costs less than a bundle (two counters, a mask)
    local id, r, lease_name = count_attempt(bund[1])
    hargs[#hargs + 1] = id
    hargs[#hargs + 1] = r
    zargs[#zargs + 1] = deadline
    zargs[#zargs + 1] = lease_name
    out[#out + 1] = r
  elseif #bund > 1 then
    local b = ':b' .. redis.call('HINCRBY', stats, 'bseq', 1) .. '.' .. now
    hargs[#hargs + 1] = b
    hargs[#hargs + 1] = cmsgpack.pack(bund)
    hargs[#hargs + 1] = b .. '~'
    hargs[#hargs + 1] = string.rep('0', #bund)
    redis.call('HINCRBY', stats, 'bundled', #bund)
    out[header_n] = {b, #bund}
    for _, e in ipairs(bund) do out[#out + 1] = e end
    ev_entry(events, ev, now, 'started', nil, 1, nil, jobmeta, nil, hargs[#hargs - 2], '',
             #bund)  -- (the packed entries: no work per job)
  end
  if #hargs > 0 then lease_entries(inflight, hargs) end
  if #zargs > 0 then
    redis.call('ZADD', reserved, unpack(zargs))
    added = deadline
  end
  if #bund > 1 then redis.call('ZADD', bundles, deadline, out[header_n][1]) end
  if any_pending and #ids > 0 then redis.call('HDEL', pending, unpack(ids)) end
  if #seqs > 0 then set_waiting(seq_top(seq), WAIT0, seqs, 0) end
  for i = 1, #tomb_del, 1000 do
    redis.call('HDEL', cancel, unpack(tomb_del, i, math.min(i + 999, #tomb_del)))
  end
  if dropped > 0 then
    redis.call('HINCRBY', stats, 'cancelled', dropped)
  end
  if #skipped > 0 then
    settle_tracked(campaigns, jobmeta, dedup, dedup_exp, skipped, 'c', now, due, known)
  end
  if #g_gone > 0 then
    -- never leased (no running count to give back): they leave their quota count
    local per, order = {}, {}
    for _, id in ipairs(g_gone) do
      local g = string.find(id, '~', 1, true) and group_of(id)
      if g then
        if not per[g] then order[#order + 1] = g; per[g] = 0 end
        per[g] = per[g] - 1
      end
    end
    gadd(gstate, order, per, ':n')
  end
  if (want <= 0 and asked > 0) or (ndrop > 0 and want > 0) then
    -- a full batch: more may be waiting, let the next idle worker look; or a call that
    -- dropped jobs and came back short (its drop budget spent, or groups it did not
    -- look at): a worker pops again at once rather than idle while jobs are ready
    token()
  end
end

if claimed then
  -- the workers blocked for those jobs may be needed for what else is ready
  token()
end
local me = ARGV[4] or ''
if me ~= '' then
  if #out > header_n then
    redis.call('ZREM', idle, me)
  elseif want0 > 0 then
    redis.call('ZADD', idle, now + tonumber(ARGV[5]), me)
  end
end

if #moved > 0 then first_due = redis.call('ZRANGE', delayed, 0, 0, 'WITHSCORES') end
if first_due[2] then out[2] = tonumber(first_due[2]) end
if flow >= 0 and (out[2] < 0 or flow < out[2]) then out[2] = flow end
if not quiet then
  local first = redis.call('ZRANGEBYSCORE', gwait, '(' .. now, '(' .. BLOCKED,
    'WITHSCORES', 'LIMIT', 0, 1)
  if first[2] and (out[2] < 0 or tonumber(first[2]) < out[2]) then
    out[2] = tonumber(first[2])
  end
end
if ev then
  -- the jobs returned with leases of their own (a bundle's have their entry above)
  for i = header_n + 1, #out - (out[header_n][2] or 0) do
    ev_entry(events, ev, now, 'started', out[i], 0, nil, jobmeta)
  end
  ev_close(evconf, events, ev, now)
end
if #gone > 0 then first_lease = redis.call('ZRANGE', reserved, 0, 0, 'WITHSCORES') end
if first_lease[2] then out[3] = tonumber(first_lease[2]) end
if added and (out[3] < 0 or added < out[3]) then out[3] = added end
if bnext >= 0 and (out[3] < 0 or bnext < out[3]) then out[3] = bnext end
return out
