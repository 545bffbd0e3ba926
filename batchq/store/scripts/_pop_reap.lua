-- _pop_reap.lua: pop.lua's first phases, upkeep before any job is popped: due delayed
-- jobs promoted, expired leases and bundles reaped, what they freed settled. Every
-- phase takes the call's context c (pop.lua: its keys, arguments and running state).
--
-- Each zset of due work (delayed, reserved, bundles) is read by its earliest entry
-- first, and its due entries only when that one is due; when nothing was taken from it,
-- that entry is the reply's next time too (this script never adds to delayed, and knows
-- its own leases' deadline). A redis.call costs a pop about what a bundled job does.

-- 1. Due delayed jobs -> their ready lists or groups (tail). Write before delete: on a
--    full Redis the first write may be refused, then nothing moves this time and the
--    pop still runs. Sets c.first_due (the earliest entry read), c.promoted.
local function promote_due(c)
  local delayed, gready, gstate, pending = KEYS[1], KEYS[33], KEYS[36], KEYS[25]
  local READY9 = 8  -- KEYS[READY9 + 9 - p]: the ready list of priority p
  local now = c.now
  c.first_due = redis.call('ZRANGE', delayed, 0, 0, 'WITHSCORES')
  -- (nothing due, as in nearly every call: no table made below)
  if not (c.first_due[2] and tonumber(c.first_due[2]) <= now) then return end
  local due = redis.call('ZRANGEBYSCORE', delayed, '-inf', now, 'LIMIT', 0, tonumber(ARGV[3]))
  local moved = {}
  for _, e in ipairs(due) do
    local p = tonumber(string.sub(e, 1, 1)) or 0
    local _, _, _, id = parse(e)
    local g = id and string.find(id, '~', 1, true) and group_of(id)
    if g then
      if not gpush(gready, gstate, {{g, p, e}}, false) then break end
      c.woken[g] = true
    elseif not try_rpush(KEYS[READY9 + 9 - p], e) then
      break
    end
    moved[#moved + 1] = e
  end
  c.promoted = #moved
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
end

-- One expired job (its lease m, id, in-flight entry e): back to the head of its list
-- with its attempt refunded, or dead (pop.lua "Crash marks"); false when a full Redis
-- refused the write.
local function reap_job(c, m, id, e)
  local recovered, started, dead_jobs, dead = KEYS[19], KEYS[20], KEYS[5], KEYS[4]
  local done, evconf, events, jobmeta = KEYS[27], KEYS[40], KEYS[41], KEYS[22]
  local pending = KEYS[25]
  local ok = true
  if not c.g_back then c.g_back, c.g_dead, c.t_dead = {}, {}, {} end  -- the first one
  local now = c.now
  local p, a, mx, _, hl = parse(e)
  local rec = redis.call('HGET', recovered, id)
  local n, cr = 0, 0
  if rec then
    local sn, sc = string.match(rec, '^(%d+):(%d+)$')
    n, cr = tonumber(sn) or 0, tonumber(sc) or 0
  end
  local charged = p and redis.call('HGET', started, id) == m
  if not p then
    -- a malformed in-flight entry (written by hand): nothing can run it
    ok = try_hset(dead_jobs, id, dead_record(id, 'lease_expired',
      'the lease of a malformed entry expired', e))
    if ok then
      redis.call('ZADD', dead, now, id)
      redis.call('PUBLISH', done .. ':' .. id, 'd')
      if c.ev == nil then c.ev = ev_open(evconf) end
      ev_entry(events, c.ev, now, 'dead', nil, 0, 'lease_expired', jobmeta, id)
      c.buried = c.buried + 1
      if tracked(id) then c.t_dead[#c.t_dead + 1] = id end
    end
  elseif charged and a >= mx then
    ok = try_hset(dead_jobs, id, dead_record(id, 'crashed_worker',
      'its worker died (or stalled past its lease) while running it, ' .. (cr + 1)
      .. ' times; ' .. (n + 1) .. ' workers died holding it', e))
    if ok then
      if c.ev == nil then c.ev = ev_open(evconf) end
      ev_entry(events, c.ev, now, 'dead', e, 0, 'crashed_worker', jobmeta, id)
      redis.call('ZADD', dead, now, id)
      redis.call('HDEL', recovered, id)
      redis.call('PUBLISH', done .. ':' .. id, 'd')
      c.crashed = c.crashed + 1
      if tracked(id) then c.t_dead[#c.t_dead + 1] = id end
    end
  else
    if charged then
      cr = cr + 1
    else
      -- not known to have started: an innocent neighbour, its attempt refunded by
      -- raising max_attempts (not by lowering attempt: the next run must hold a new
      -- lease name, or a late ack of this one would finish it)
      e = with_attempt(e, p, a, mx + 1, id, hl)
    end
    -- back to the head of its ready list, or of its group
    local g = string.find(id, '~', 1, true) and group_of(id)
    if g then
      c.woken[g] = true
      ok = gpush(KEYS[33], KEYS[36], {{g, p, e}}, true)  -- gready, gstate
    else
      ok = try_lpush(KEYS[8 + 9 - p], e)  -- KEYS[READY9 + 9 - p]: priority p's ready list
    end
    if ok then
      redis.call('HSET', recovered, id, (n + 1) .. ':' .. cr)
      redis.call('HSET', pending, id, 'r')
      c.reaped = c.reaped + 1
      c.g_back[#c.g_back + 1] = id
    end
  end
  if ok and c.g_back[#c.g_back] ~= id then c.g_dead[#c.g_dead + 1] = id end
  return ok
end

-- 2. Expired leases -> their ready list's head (latest first, so the earliest ends up
--    in front), or dead. Sets c.first_lease (the earliest entry read), c.gone (the
--    leases taken), c.ok (false: a full Redis refused a write, the rest wait).
local function reap_leases(c)
  local reserved, inflight, wake, started = KEYS[2], KEYS[3], KEYS[6], KEYS[20]
  c.first_lease = redis.call('ZRANGE', reserved, 0, 0, 'WITHSCORES')
  if not (c.first_lease[2] and tonumber(c.first_lease[2]) <= c.now) then return end
  local expired = redis.call('ZRANGEBYSCORE', reserved, '-inf', c.now, 'LIMIT', 0,
    tonumber(ARGV[3]))
  local gone = {}
  c.gone = gone
  for x = #expired, 1, -1 do
    local m = expired[x]
    local id = member_id(m)
    local e = id and redis.call('HGET', inflight, id)
    if e then
      c.ok = reap_job(c, m, id, e)
      if not c.ok then break end  -- refused (full Redis): the rest stay until later
      -- a job handed off (enqueue.lua) that nobody took is on the wake list still: it
      -- goes, or a late BLPOP would run it beside its reaped copy
      redis.call('LREM', wake, 1, e)
      redis.call('HDEL', started, id)
      redis.call('HDEL', inflight, id)
    end
    gone[#gone + 1] = m
  end
end

-- 2'. Expired bundles: each running job as if it had a lease of its own, latest first.
--    The earliest deadline first (one entry: the reply's next deadline when it is not
--    due, as it is in nearly every call); only when it is due, the expired ones (at
--    most chunk). A range over every live bundle would read one entry per pop in
--    flight. Sets c.bnext (the next bundle deadline, -1: none).
local function reap_bundles(c)
  local bundles, inflight, stats = KEYS[39], KEYS[3], KEYS[18]
  local now = c.now
  local bexp = false
  c.bnext = -1
  local bz = redis.call('ZRANGE', bundles, 0, 0, 'WITHSCORES')
  if bz[2] and tonumber(bz[2]) <= now and c.ok then
    bexp = redis.call('ZRANGEBYSCORE', bundles, '-inf', now, 'LIMIT', 0, tonumber(ARGV[3]))
    bz = redis.call('ZRANGE', bundles, #bexp, #bexp, 'WITHSCORES')
  end
  if bz[2] then c.bnext = tonumber(bz[2]) end
  if not bexp then return end  -- none due (nearly every call): no table made below
  local met, orphans = {}, {}  -- bundles read (bundle_state); members without fields
  for x = #bexp, 1, -1 do
    local b = bexp[x]
    local bd = bundle_state(inflight, met, b)
    if not bd then orphans[#orphans + 1] = b end
    for pos = bd and #bd[2] or 0, 1, -1 do
      local id, e = bundle_job(bd, pos)
      if id then
        c.ok = reap_job(c, b .. string.char(math.floor(pos / 256), pos % 256), id, e)
        if not c.ok then
          bd[2][pos] = 48  -- still running: the bundle stays until later
          bd[3] = bd[3] - 1
          break
        end
      end
    end
    if not c.ok then
      c.bnext = now  -- refused (full Redis): this bundle stays, expired
      break
    end
  end
  if #met > 0 then
    bundle_done(bundles, inflight, stats, met)
    unpin(inflight)
  end
  if #orphans > 0 then redis.call('ZREM', bundles, unpack(orphans)) end
end

-- What the reaping freed, settled: the leases taken leave reserved, the dead are
-- counted, grouped jobs give back their slots (gsettle), tracked jobs dead are settled
-- in their campaigns (the campaigns that became due: c.due), and a wake token is left
-- when jobs became ready.
local function settle_reaped(c)
  local reserved, inflight, stats, gstate = KEYS[2], KEYS[3], KEYS[18], KEYS[36]
  local gwait, wake, campaigns, jobmeta = KEYS[35], KEYS[6], KEYS[21], KEYS[22]
  local dedup, dedup_exp = KEYS[23], KEYS[24]
  if c.gone and #c.gone > 0 then
    redis.call('ZREM', reserved, unpack(c.gone))
    unpin(inflight)
  end
  if c.buried + c.crashed > 0 then
    redis.call('HINCRBY', stats, 'dead', c.buried + c.crashed)
  end
  if c.g_back then  -- jobs were reaped (reap_job made these lists)
    gsettle(gstate, gwait, wake, c.g_back, false)
    gsettle(gstate, gwait, wake, c.g_dead, true)
    if #c.t_dead > 0 then
      settle_tracked(campaigns, jobmeta, dedup, dedup_exp, c.t_dead, 'd', c.now,
        c.due)
    end
  end
  if c.promoted > 0 or c.reaped > 0 then
    leave_wake_token(wake)
  end
end
