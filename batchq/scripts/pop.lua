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
--          it is dropped and counted cancelled
-- KEYS[25] pending hash: id -> "r" | delayed entry (see enqueue.lua); kept in step with
--          every move below, and the popped ids leave it
-- KEYS[26] cancel hash: ids of cancelled ready jobs (cancel.lua); a popped one is
--          dropped (never reserved nor run) and counted in stats "cancelled" (a tracked
--          one is settled as cancelled in its campaign)
-- KEYS[27] done: prefix of the per-job channels; a job dead-lettered here is announced
--          on "<done>:<id>" with "d"
-- KEYS[28] seq counter; KEYS[29..32] waiting bitmaps, slots 0..3 (enqueue.lua): a popped
--          job's bit is cleared (one SETBIT per job; ids without a sequence number: none)
-- ARGV[1]  how many jobs to pop (0 = maintenance only)
-- ARGV[2]  lease in ms
-- ARGV[3]  chunk: at most this many delayed and expired jobs are moved per call
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
-- Returns {now_ms, next_due_ms or -1, next_deadline_ms or -1, promoted, reaped,
--          expired (dead-lettered: lease_expired), malformed (dead-lettered:
--          decode_error), crashed (dead-lettered: crashed_worker), {positions (1-based,
--          among the jobs) of jobs to run alone}, {ids of campaigns that became due:
--          the worker tries to complete them}, job, job, ...}; each job is the entry
--          with its attempt counted.
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

local ISOLATE_AFTER = 2  -- recoveries after which a job runs alone, its start recorded

local now = now_ms()
local want = tonumber(ARGV[1])
local lease = tonumber(ARGV[2])
local chunk = tonumber(ARGV[3])

local function ready_key(p)
  return KEYS[READY9 + 9 - p]
end

-- 1. due delayed jobs -> ready (write before delete; on a full Redis the first write may
--    be refused: then nothing moves this time, and the pop below still runs)
local due = redis.call('ZRANGEBYSCORE', delayed, '-inf', now, 'LIMIT', 0, chunk)
local moved = {}
for _, e in ipairs(due) do
  local p = tonumber(string.sub(e, 1, 1)) or 0
  if not try_rpush(ready_key(p), e) then break end
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
local expired = redis.call('ZRANGEBYSCORE', reserved, '-inf', now, 'LIMIT', 0, chunk)
local gone = {}
local t_dead = {}  -- tracked jobs reaped dead
for x = #expired, 1, -1 do
  local m = expired[x]
  local id = member_id(m)
  local e = id and redis.call('HGET', inflight, id)
  local ok = true
  if e then
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
        buried = buried + 1
        if tracked(id) then t_dead[#t_dead + 1] = id end
      end
    elseif charged and a >= mx then
      ok = try_hset(dead_jobs, id, dead_record(id, 'crashed_worker',
        'its worker died (or stalled past its lease) while running it, ' .. (c + 1)
        .. ' times; ' .. (n + 1) .. ' workers died holding it', e))
      if ok then
        redis.call('ZADD', dead, now, id)
        redis.call('HDEL', recovered, id)
        redis.call('PUBLISH', done .. ':' .. id, 'd')
        crashed = crashed + 1
        if tracked(id) then t_dead[#t_dead + 1] = id end
      end
    else
      if charged then
        c = c + 1
        ok = try_lpush(ready_key(p), e)
      else
        -- not known to have started: an innocent neighbour, its attempt refunded by
        -- raising max_attempts (not by lowering attempt: the next run must hold a new
        -- lease name, or a late ack of this one would finish it)
        ok = try_lpush(ready_key(p), with_attempt(e, p, a, mx + 1, id, hl))
      end
      if ok then
        redis.call('HSET', recovered, id, (n + 1) .. ':' .. c)
        redis.call('HSET', pending, id, 'r')
        reaped = reaped + 1
      end
    end
    if ok then
      redis.call('HDEL', started, id)
      redis.call('HDEL', inflight, id)
    end
  end
  if not ok then break end  -- refused (full Redis): the rest stay reserved until later
  gone[#gone + 1] = m
end
if #gone > 0 then
  redis.call('ZREM', reserved, unpack(gone))
end
if buried + crashed > 0 then
  redis.call('HINCRBY', stats, 'dead', buried + crashed)
end
local due = {}
if #t_dead > 0 then
  settle_tracked(campaigns, jobmeta, dedup, dedup_exp, t_dead, 'd', now, due)
end
if #moved > 0 or reaped > 0 then
  leave_wake_token(wake)
end

-- 3. pop and reserve
local marks = {}
local out = {now, -1, -1, #moved, reaped, buried, 0, crashed, marks, due}
local header_n = #out
if want > 0 and redis.call('EXISTS', paused) == 0 then
  local deadline = now + lease
  local any_recovered = redis.call('HLEN', recovered) > 0
  local any_tombstones = redis.call('HLEN', cancel) > 0
  local hargs, zargs, ids = {}, {}, {}
  local dropped = 0
  -- tracked jobs: only while a campaign is cancelled on this queue ("~cancelled" > 0)
  -- is each one's campaign flag looked up, to drop it; otherwise they cost nothing here
  local any_cancelled = tonumber(redis.call('HGET', campaigns, '~cancelled') or '0') > 0
  local flags, skipped = {}, {}
  for p = 9, 0, -1 do
    if want <= 0 then break end
    local items = redis.call('LPOP', ready_key(p), want)
    if items then
      want = want - #items
      for _, e in ipairs(items) do
        local ep, a, mx, id, hl = parse(e)
        if ep and any_tombstones and redis.call('HDEL', cancel, id) == 1 then
          -- cancelled while it waited (cancel.lua): dropped, never run
          dropped = dropped + 1
          if tracked(id) then skipped[#skipped + 1] = id end
          ep = false
        end
        if any_cancelled and ep and tracked(id) then
          local v = redis.call('HGET', jobmeta, id)
          local cid = v and string.match(v, '^([^\n]*)\n') or ''
          if cid ~= '' and flags[cid] == nil then
            flags[cid] = redis.call('HGET', campaigns, cid .. ':f') or ''
          end
          if cid ~= '' and flags[cid] == 'cancelled' then
            skipped[#skipped + 1] = id
            ids[#ids + 1] = id  -- popped: leaves the pending index and its bitmap
            ep = false
          end
        end
        if ep == false then
          -- cancelled: dropped here (counted below), never reserved
        elseif ep then
          ids[#ids + 1] = id
          local r = with_attempt(e, ep, a + 1, mx, id, hl)
          hargs[#hargs + 1] = id
          hargs[#hargs + 1] = r
          zargs[#zargs + 1] = deadline
          zargs[#zargs + 1] = id .. ':' .. (a + 1)
          out[#out + 1] = r
          local rec = any_recovered and redis.call('HGET', recovered, id)
          if rec and (tonumber(string.match(rec, '^(%d+)')) or 0) >= ISOLATE_AFTER then
            marks[#marks + 1] = #out - header_n
          end
        else
          -- each malformed entry keeps its own record, even identical ones
          local nth = redis.call('HINCRBY', stats, 'malformed', 1)
          bury(dead, dead_jobs, now,
            'raw-' .. string.sub(redis.sha1hex(e), 1, 20) .. '-' .. nth,
            'decode_error', 'malformed job header', e)
          out[7] = out[7] + 1
        end
      end
    end
  end
  if #hargs > 0 then
    redis.call('HSET', inflight, unpack(hargs))
    redis.call('ZADD', reserved, unpack(zargs))
  end
  if #ids > 0 then
    if redis.call('HLEN', pending) > 0 then
      redis.call('HDEL', pending, unpack(ids))
    end
    local top = seq_top(seq)
    for _, id in ipairs(ids) do
      local slot, off = wait_pos(top, seq_of(id))
      if slot then redis.call('SETBIT', KEYS[WAIT0 + slot], off, 0) end
    end
  end
  if dropped > 0 then
    redis.call('HINCRBY', stats, 'cancelled', dropped)
  end
  if #skipped > 0 then
    settle_tracked(campaigns, jobmeta, dedup, dedup_exp, skipped, 'c', now, due)
  end
  if want <= 0 then
    -- a full batch: more may be waiting, let the next idle worker look
    leave_wake_token(wake)
  end
end

local first = redis.call('ZRANGE', delayed, 0, 0, 'WITHSCORES')
if first[2] then out[2] = tonumber(first[2]) end
first = redis.call('ZRANGE', reserved, 0, 0, 'WITHSCORES')
if first[2] then out[3] = tonumber(first[2]) end
return out
