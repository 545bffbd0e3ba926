-- _pop_reserve.lua: pop.lua's reserve phases: what the queue has, jobs handed off
-- claimed, ready jobs popped from the plain lists, each popped entry screened (a
-- cancelled or malformed one dropped) and reserved, the leases written, the drops
-- settled. Every phase takes the call's context c (pop.lua).

local ISOLATE_AFTER = 2  -- recoveries after which a job runs alone, its start recorded

-- A plain queue's pop: one EXISTS says that none of these is there (not paused, no
-- crash marks, cancelled or pending jobs, limits, groups or waits), and the reads each
-- would need are skipped; with any of them there, each is read as it is needed. EXISTS
-- counts each mention: the expires zset is named 8 times and the events config 16, so
-- the reply says all three (count % 8: the others; its 8: jobs with a deadline; >= 16:
-- events on). Sets c.quiet, c.ev and c.expiring.
local function read_quiet(c)
  local paused, recovered, cancel, pending = KEYS[7], KEYS[19], KEYS[26], KEYS[25]
  local limits, groups, gwait, evconf = KEYS[37], KEYS[34], KEYS[35], KEYS[40]
  local expires = KEYS[42]
  local x, v = expires, evconf
  local quiet = next(c.woken) == nil and redis.call('EXISTS', paused, recovered,
    cancel, pending, limits, groups, gwait, x, x, x, x, x, x, x, x, v, v, v, v, v, v, v, v,
    v, v, v, v, v, v, v, v)
  if c.ev == nil then c.ev = (not quiet or quiet >= 16) and ev_open(evconf) end
  c.expiring = not quiet or quiet % 16 >= 8
  c.quiet = quiet and quiet % 16 == 0
end

-- Leave a wake token (a call that emptied the wake list knows it needs no LLEN).
local function wake_token(c)
  local wake = KEYS[6]
  if c.wake_empty then
    redis.pcall('RPUSH', wake, '1')
    c.wake_empty = false
  else
    leave_wake_token(wake)
  end
end

-- Jobs handed off (leased by enqueue.lua) that no blocked worker has taken: this pop
-- takes them as they are; wake tokens popped with them are spent by this pop.
local function claim_handoffs(c)
  local wake = KEYS[6]
  if c.want <= 0 then return end
  local w = redis.call('LPOP', wake, c.want)
  c.wake_empty = not w or #w < c.want
  if w then
    local out = c.out
    for _, v in ipairs(w) do
      if v ~= '1' then
        out[#out + 1] = v
        c.want = c.want - 1
        c.claimed = true
      end
    end
  end
end

-- The reserve's state, made when the call will pop (an empty-handed call makes none).
local function begin_reserve(c)
  c.deadline = c.now + tonumber(ARGV[2])
  c.hargs, c.zargs, c.ids = {}, {}, {}  -- in-flight fields, reserved members, ids popped
  c.dropped = 0
  c.seqs = {}  -- the sequence numbers of the jobs popped (their waiting bits)
  c.bund = {}  -- the entries of this call's bundle (ARGV[6])
  c.ndrop = 0  -- cancelled (or expired) entries dropped by this call
  c.nexp = 0  -- expired ones
  -- the drop lists are made by the first screen (a plain bundling pop screens none):
  -- c.g_gone (grouped jobs dropped: out of their group's quota count), c.flags
  -- (campaign flags read), c.skipped (tracked jobs dropped), c.xids (expired ones'
  -- ids: tracked ones settled as expired), c.tomb_del (tombstones deleted at the end),
  -- c.known (id -> jobmeta entry of the campaign jobs dropped: settle_tracked)
end

-- Read once, when the first job is taken (an empty pop reads none of them): recovered
-- jobs, cancelled ones, and tracked jobs (only while a campaign is cancelled on this
-- queue, "~cancelled" > 0, is each one's campaign flag looked up, to drop it;
-- otherwise they cost nothing here).
local function read_flags(c)
  local recovered, cancel, pending, campaigns = KEYS[19], KEYS[26], KEYS[25], KEYS[21]
  if c.any_recovered == nil then
    local quiet = c.quiet
    c.any_recovered = not quiet and redis.call('HLEN', recovered) > 0
    c.any_tombstones = not quiet and redis.call('HLEN', cancel) > 0
    c.any_pending = not quiet and redis.call('HLEN', pending) > 0
    c.any_cancelled = tonumber(redis.call('HGET', campaigns, '~cancelled') or '0') > 0
  end
end

-- A per-job drop at pop: entry e (id, cancel tombstone t, jobmeta entry v, campaign
-- cid) is dropped, never reserved nor run, when it was cancelled while it waited
-- (cancel.lua), or belongs to a campaign cancelled on this queue, or is past its
-- deadline (tombstone "x", or "k": kept in dead, reason "expired"; _expiry.lua); true
-- when dropped. "q": its group's quota count was given back by the cancel itself.
local function drop_job(c, e, id, t, v, cid)
  local dead, dead_jobs, events, jobmeta = KEYS[4], KEYS[5], KEYS[41], KEYS[22]
  if t == 'x' or t == 'k' then
    c.tomb_del[#c.tomb_del + 1] = id
    c.ndrop = c.ndrop + 1
    c.nexp = c.nexp + 1
    c.xids[#c.xids + 1] = id
    c.g_gone[#c.g_gone + 1] = id
    c.ids[#c.ids + 1] = id  -- popped: leaves the pending index and its bitmap
    local q = seq_of(id)
    if q then c.seqs[#c.seqs + 1] = q end
    ev_entry(events, c.ev, c.now, 'expired', e, 0, nil, jobmeta, id)
    if t == 'k' then
      bury(dead, dead_jobs, c.now, id, 'expired', 'not started by its deadline', e)
    end
    return true
  end
  if t then
    c.tomb_del[#c.tomb_del + 1] = id
    c.dropped = c.dropped + 1
    c.ndrop = c.ndrop + 1
    if tracked(id) then c.skipped[#c.skipped + 1] = id end
    if t ~= 'q' then c.g_gone[#c.g_gone + 1] = id end
    return true
  end
  if cid ~= '' and c.flags[cid] == 'cancelled' then
    c.dropped = c.dropped + 1
    c.ndrop = c.ndrop + 1
    c.skipped[#c.skipped + 1] = id
    c.known[id] = v
    ev_entry(events, c.ev, c.now, 'cancelled', e, 0, 'campaign cancelled', jobmeta, id)
    c.ids[#c.ids + 1] = id  -- popped: leaves the pending index and its bitmap
    local q = seq_of(id)
    if q then c.seqs[#c.seqs + 1] = q end
    c.g_gone[#c.g_gone + 1] = id
    return true
  end
  return false
end

-- Popped entries es[1..] screened in order: a cancelled one is dropped (drop_job), a
-- malformed one buried, the others returned as {entry, nil, nil, id, position in es}
-- (reserve's priority and attempt: parsed when leased), at most `limit` of them (nil:
-- all); also how many entries were used (the rest are left as they are).
-- The lookups are read-only and batched: one HMGET of the cancel hash while it has
-- tombstones, one of jobmeta for the tracked jobs while a campaign is cancelled here.
-- A dropped one costs the call nothing it counts: no rate token, slot, quota or share
-- of `want`.
local function screen(c, es, limit)
  local cancel, jobmeta, campaigns, stats = KEYS[26], KEYS[22], KEYS[21], KEYS[18]
  local dead, dead_jobs, events = KEYS[4], KEYS[5], KEYS[41]
  read_flags(c)
  if not c.flags then  -- the drop lists (begin_reserve), made once a call
    c.flags, c.skipped, c.g_gone, c.xids, c.tomb_del, c.known = {}, {}, {}, {}, {}, {}
  end
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
  if c.any_tombstones then lookup(cancel, function() return true end, tomb) end
  if c.any_cancelled then
    lookup(jobmeta, function(i) return not tomb[i] and tracked(idl[i]) end, meta)
  end
  local flags = c.flags
  local live, used = {}, 0
  for i = 1, n do
    if limit and #live >= limit then break end
    used = i
    local e, id, v = es[i], idl[i], meta[i]
    local cid = v and string.match(v, '^([^\n]*)\n') or ''
    if cid ~= '' and flags[cid] == nil then
      flags[cid] = redis.call('HGET', campaigns, cid .. ':f') or ''
    end
    if not id then
      -- each malformed entry keeps its own record, even identical ones
      local nth = redis.call('HINCRBY', stats, 'malformed', 1)
      bury(dead, dead_jobs, c.now,
        'raw-' .. string.sub(redis.sha1hex(e), 1, 20) .. '-' .. nth,
        'decode_error', 'malformed job header', e)
      ev_entry(events, c.ev, c.now, 'dead', nil, 0, 'decode_error', jobmeta, '')
      c.out[7] = c.out[7] + 1
    elseif not drop_job(c, e, id, tomb[i], v, cid) then
      live[#live + 1] = {e, nil, nil, id, i}
    end
  end
  return live, used
end

-- A screened entry reserved: leased (its attempt counted, a lease of its own), or
-- added to the bundle as popped (the worker counts the attempt).
local function reserve_job(c, e, p, a, id)
  local recovered = KEYS[19]
  c.ids[#c.ids + 1] = id
  local q = seq_of(id)
  if q then c.seqs[#c.seqs + 1] = q end
  if c.bundling and not c.any_recovered then
    c.bund[#c.bund + 1] = e
    if not c.btracked and tracked(id) then c.btracked = true end
    return
  end
  local _, r, lease_name = count_attempt(e, p, a, id)
  local hargs, zargs, out = c.hargs, c.zargs, c.out
  hargs[#hargs + 1] = id
  hargs[#hargs + 1] = r
  zargs[#zargs + 1] = c.deadline
  zargs[#zargs + 1] = lease_name
  out[#out + 1] = r
  local rec = c.any_recovered and redis.call('HGET', recovered, id)
  if rec and (tonumber(string.match(rec, '^(%d+)')) or 0) >= ISOLATE_AFTER then
    c.marks[#c.marks + 1] = #out - c.header_n
  end
end

-- A bundling pop's jobs (the common case) inline, anything else screened: the header
-- matched by positions (no string made), the id's sequence number read from the entry
-- (seq_of's rule: "-" after 17 characters, then hex, then "_m" for a tracked job), the
-- id itself made only while the pending index has entries. A tracked job (campaign or
-- dedup key) is bundled too: it is settled by id wherever a bundle job ends (ack.lua,
-- nack.lua, the reaper); only while a campaign is cancelled on this queue is it
-- screened first (its campaign's flag: dropped, or bundled in its place). c.btracked:
-- the bundle holds a tracked job (its events name their campaigns, one by one).
-- (_entries.lua header_id and _tracked.lua tracked apply the same rules: change them
-- together.)
local function bundle_items(c, items)
  local byte, sub, find = string.byte, string.sub, string.find
  local bund, seqs, ids, any_pending = c.bund, c.seqs, c.ids, c.any_pending
  local screen_tracked = c.any_cancelled
  local nb, ns = #bund, #seqs
  local slow, slot = {}, {}  -- entries left to screen, their places in bund
  for _, e in ipairs(items) do
    local _, _, a, z = find(e, '^%d:%d+:%d+:()[^:]+():')
    -- a <= 18: attempt and max_attempts short (header_id); tracked: "_m"
    local tk = a and byte(e, z - 2) == 95 and byte(e, z - 1) == 109
    if a and a <= 18 and not (tk and screen_tracked) then
      nb = nb + 1
      bund[nb] = e
      if byte(e, a + 17) == 45 then
        local q = tonumber(sub(e, a + 18, tk and z - 3 or z - 1), 16)
        if q then
          ns = ns + 1
          seqs[ns] = q
        end
      end
      if tk then c.btracked = true end
      if any_pending then ids[#ids + 1] = sub(e, a, z - 1) end
    else
      nb = nb + 1
      bund[nb] = false  -- its place, if it is bundled
      slow[#slow + 1] = e
      slot[#slow] = nb
    end
  end
  if #slow > 0 then
    -- screened together; a live one keeps its place in the bundle, a dropped one's
    -- place goes
    for _, x in ipairs((screen(c, slow))) do
      bund[slot[x[5]]] = x[1]
      c.ids[#c.ids + 1] = x[4]
      local q = seq_of(x[4])
      if q then c.seqs[#c.seqs + 1] = q end
      if tracked(x[4]) then c.btracked = true end
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
end

-- The plain ready lists' share (c.plain), highest priority first: LMPOP takes from the
-- first non-empty list in one command (Redis 7.0+; an empty reply says they are all
-- empty); before 7.0, LPOP each list in turn. Without groups the jobs are reserved (or
-- bundled) at once; with groups they are the first lane, reserved in turns. Cancelled
-- entries dropped do not count against c.plain / c.want: the loop pops again in their
-- place, until the call has dropped ARGV[7] of them in all.
local function pop_plain(c)
  local READY9 = 8  -- KEYS[READY9 + 9 - p]: the ready list of priority p
  local drop_max = tonumber(ARGV[7]) or 0
  -- how many of the ten ready lists hold jobs (one command: an empty pop, the idle
  -- worker's, makes no LPOP at all, and none is made below the last non-empty list)
  local nonempty = 0
  if c.plain > 0 and c.lmpop then
    nonempty = 10
  elseif c.plain > 0 then
    nonempty = redis.call('EXISTS', KEYS[READY9 + 9 - 9], KEYS[READY9 + 9 - 8],
      KEYS[READY9 + 9 - 7], KEYS[READY9 + 9 - 6], KEYS[READY9 + 9 - 5], KEYS[READY9 + 9 - 4],
      KEYS[READY9 + 9 - 3], KEYS[READY9 + 9 - 2], KEYS[READY9 + 9 - 1], KEYS[READY9 + 9 - 0])
  end
  local p = 9  -- without LMPOP: the next list to LPOP
  while c.plain > 0 and nonempty > 0 and p >= 0
      and (c.ndrop == 0 or c.ndrop < drop_max) do
    local items
    local ask = c.plain
    if c.lmpop then
      -- the lists above the one it takes from are empty, and that one is emptied
      -- unless the call has all it wants: the next call asks all ten again
      local got = redis.pcall('LMPOP', 10, KEYS[READY9 + 9 - 9], KEYS[READY9 + 9 - 8], KEYS[READY9 + 9 - 7], KEYS[READY9 + 9 - 6],
        KEYS[READY9 + 9 - 5], KEYS[READY9 + 9 - 4], KEYS[READY9 + 9 - 3], KEYS[READY9 + 9 - 2], KEYS[READY9 + 9 - 1], KEYS[READY9 + 9 - 0], 'LEFT',
        'COUNT', ask)
      if type(got) == 'table' and got.err then
        -- refused (an ACL user without +lmpop): as before 7.0
        c.lmpop = false
        nonempty = redis.call('EXISTS', KEYS[READY9 + 9 - 9], KEYS[READY9 + 9 - 8],
          KEYS[READY9 + 9 - 7], KEYS[READY9 + 9 - 6], KEYS[READY9 + 9 - 5], KEYS[READY9 + 9 - 4],
          KEYS[READY9 + 9 - 3], KEYS[READY9 + 9 - 2], KEYS[READY9 + 9 - 1], KEYS[READY9 + 9 - 0])
      elseif not got then
        break
      else
        items = got[2]
      end
    else
      items = redis.call('LPOP', KEYS[READY9 + 9 - p], ask)
      -- a list that gave all it was asked may hold more (asked again after drops)
      if not items or #items < ask then p = p - 1 end
    end
    if items then
      if #items < ask then nonempty = nonempty - 1 end
      local d0 = c.ndrop
      if #c.sel == 0 then  -- no groups: no turns to take
        read_flags(c)
        if c.bundling and not c.any_recovered and not c.any_tombstones then
          bundle_items(c, items)
        else
          for _, x in ipairs((screen(c, items))) do reserve_job(c, x[1], x[2], x[3], x[4]) end
        end
      else
        local lane = c.lanes[1]
        for _, x in ipairs((screen(c, items))) do lane[#lane + 1] = x end
      end
      c.plain = c.plain - (#items - (c.ndrop - d0))
      c.want = c.want - (#items - (c.ndrop - d0))
    end
  end
end

-- The leases written: a bundle of one job has a lease of its own (it costs less than a
-- bundle: two counters, a mask); the in-flight entries, the reserved members (c.added:
-- their deadline), the bundle's deadline, the pending index and the waiting bits.
local function lease_jobs(c)
  local stats, events, jobmeta, inflight = KEYS[18], KEYS[41], KEYS[22], KEYS[3]
  local reserved, bundles, pending, seq = KEYS[2], KEYS[39], KEYS[25], KEYS[28]
  local WAIT0 = 29  -- KEYS[WAIT0 + s]: the waiting bitmap of slot s
  local bund, hargs, zargs, out = c.bund, c.hargs, c.zargs, c.out
  if #bund == 1 then
    local id, r, lease_name = count_attempt(bund[1])
    hargs[#hargs + 1] = id
    hargs[#hargs + 1] = r
    zargs[#zargs + 1] = c.deadline
    zargs[#zargs + 1] = lease_name
    out[#out + 1] = r
  elseif #bund > 1 then
    local b = ':b' .. redis.call('HINCRBY', stats, 'bseq', 1) .. '.' .. c.now
    hargs[#hargs + 1] = b
    hargs[#hargs + 1] = cmsgpack.pack(bund)
    hargs[#hargs + 1] = b .. '~'
    hargs[#hargs + 1] = string.rep('0', #bund)
    redis.call('HINCRBY', stats, 'bundled', #bund)
    out[c.header_n] = {b, #bund}
    for _, e in ipairs(bund) do out[#out + 1] = e end
    if c.btracked and c.ev then  -- their campaigns named: one event a job
      for _, e in ipairs(bund) do
        ev_entry(events, c.ev, c.now, 'started', e, 1, nil, jobmeta)
      end
    else
      ev_entry(events, c.ev, c.now, 'started', nil, 1, nil, jobmeta, nil,
               hargs[#hargs - 2], '', #bund)  -- (the packed entries: no work per job)
    end
  end
  if #hargs > 0 then lease_entries(inflight, hargs) end
  if #zargs > 0 then
    redis.call('ZADD', reserved, unpack(zargs))
    c.added = c.deadline
  end
  if #bund > 1 then redis.call('ZADD', bundles, c.deadline, out[c.header_n][1]) end
  if c.any_pending and #c.ids > 0 then redis.call('HDEL', pending, unpack(c.ids)) end
  if #c.seqs > 0 then
    set_waiting(seq_top(seq), WAIT0, c.seqs, 0, c.sel and #c.sel > 0)
  end
end

-- The drops settled: tombstones deleted, counted in stats "cancelled", tracked jobs
-- settled as cancelled in their campaigns, grouped ones out of their quota count
-- (never leased: no running count to give back). An expired job is announced on its
-- done channel ("x"); one not kept in dead (tombstone "x") is marked "X" in the cancel
-- hash for status.lua ("expired") for EXPIRED_KEEP_MS: its "~<id>" member in the
-- expires zset then removes the mark (a kept one reads "dead", and may be redriven).
local EXPIRED_KEEP_MS = 3600000
local function settle_dropped(c)
  local cancel, stats, campaigns, jobmeta = KEYS[26], KEYS[18], KEYS[21], KEYS[22]
  local dedup, dedup_exp, gstate = KEYS[23], KEYS[24], KEYS[36]
  if c.ndrop == 0 then return end  -- nothing dropped (the drop lists may not exist)
  local tomb_del = c.tomb_del
  local kinds = c.nexp > 0 and redis.call('HMGET', cancel, unpack(c.xids))
  for i = 1, #tomb_del, 1000 do
    redis.call('HDEL', cancel, unpack(tomb_del, i, math.min(i + 999, #tomb_del)))
  end
  if c.dropped > 0 then
    redis.call('HINCRBY', stats, 'cancelled', c.dropped)
  end
  if c.nexp > 0 then
    redis.call('HINCRBY', stats, 'expired', c.nexp)
    settle_tracked(campaigns, jobmeta, dedup, dedup_exp, c.xids, 'x', c.now, c.due)
    local done, later = KEYS[27], {}
    for i, id in ipairs(c.xids) do
      if kinds[i] == 'x' then
        redis.call('HSET', cancel, id, 'X')
        later[#later + 1] = c.now + EXPIRED_KEEP_MS
        later[#later + 1] = '~' .. id
      end
      redis.call('PUBLISH', done .. ':' .. id, 'x')
      if #later >= 2000 then redis.call('ZADD', KEYS[42], unpack(later)); later = {} end
    end
    if #later > 0 then redis.call('ZADD', KEYS[42], unpack(later)) end
  end
  if #c.skipped > 0 then
    settle_tracked(campaigns, jobmeta, dedup, dedup_exp, c.skipped, 'c', c.now,
      c.due, c.known)
  end
  if #c.g_gone > 0 then
    local per, order = {}, {}
    for _, id in ipairs(c.g_gone) do
      local g = string.find(id, '~', 1, true) and group_of(id)
      if g then
        if not per[g] then order[#order + 1] = g; per[g] = 0 end
        per[g] = per[g] - 1
      end
    end
    gadd(gstate, order, per, ':n')
  end
end
