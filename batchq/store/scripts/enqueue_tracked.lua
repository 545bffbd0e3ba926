-- enqueue_tracked.lua: write tracked jobs (campaign members, jobs with a dedup key):
-- like enqueue.lua / schedule.lua, plus their jobmeta entries, the campaign's counters
-- on this queue and the dedup index. Plain jobs never come here.
--
-- KEYS[1]  ready list of the jobs' priority      KEYS[6]  campaigns hash
-- KEYS[2]  delayed zset                          KEYS[7]  jobmeta hash
-- KEYS[3]  wake list                             KEYS[8]  dedup hash: key -> job id
-- KEYS[4]  inflight hash                         KEYS[9]  dedup:exp zset: key -> lapse ms
-- KEYS[5]  stats hash (field "enqueued")
-- KEYS[10] pending hash: a delayed job's id -> its entry (cancel.lua, status.lua)
-- KEYS[11] seq counter; KEYS[12..15] waiting bitmaps, slots 0..3: a ready job's bit
--          (its id's sequence number, "-<hex>_m") is set, a few commands per run of
--          consecutive numbers (_waiting.lua set_waiting)
-- KEYS[16] gready zset, KEYS[17] groups zset, KEYS[18] gwait zset, KEYS[19] gstate
--          hash, KEYS[20] limits hash: jobs of a group (their ids end "~<g>_m", all of
--          one call in one group) go to the group (see enqueue_group.lua), within its
--          max_pending
-- KEYS[21] replace hash: dedup key -> the entry a "replace" / "debounce" call wrote
--          for it (found in its ready list by LPOS); dropped with the key's lapse
-- ARGV[1]  "1" when retrying a call whose reply was lost: a job whose jobmeta entry
--          exists (written by the lost call) is not written again
-- ARGV[2]  "ready", or "rel" / "abs" (delayed: ARGV[3] is a delay from the server's now,
--          or a Unix time, in ms)
-- ARGV[3]  the delay or the due time (ignored for "ready")
-- ARGV[4]  campaign id, "" for none: the campaign must be open on this queue
-- ARGV[5]  key ttl ms: how long a dedup key stays held after its job is settled
-- ARGV[6]  at most this many lapsed dedup keys are dropped first (bounds the loop)
-- ARGV[7]  on conflict, what a row does when its key is held by a job still waiting:
--          "keep" (nothing), "replace" (the job keeps its id, place and due time, and
--          takes the row's body: its arguments), "debounce" (replace, and a delayed
--          job is due again at ARGV[2]/ARGV[3] from now). A holder that is running or
--          settled, or a ready one not found (LPOS: a grouped job, another priority,
--          deeper than ARGV[8]), is kept.
-- ARGV[8]  LPOS scans at most this many entries of the ready list, from its tail
-- KEYS[22] expires zset: the jobs' deadline (_expiry.lua), the earlier of ARGV[9] and
--          the campaign's ("<campaign>:e" in the campaigns hash, campaign_queue.lua)
-- ARGV[9]  the jobs' expiry: "r<ms>" (after the server's now), "a<Unix ms>", then "k"
--          (kept in dead once expired); "" for none
-- ARGV[10] "" when the call's jobs are of one group (read from the first id) or none;
--          for a call of several groups (enqueue_many's group_fn), the rows' groups as
--          runs in row order "<g>:<count>,<g>:<count>,..." ("<g>" empty: rows without a
--          group, written to the ready list): each group's quota is checked, its rows
--          written and its count raised as a one-group call would
-- ARGV[11] the first row's sequence number when the rows' numbers run on from it one
--          by one (each ready row's bit is then found without reading its id), else ""
-- ARGV[12..] pairs: encoded job (id ending "_m"), dedup key ("" for none); at most 1000
-- Returns  {0, written, position, id, position, id, ...}: the 1-based positions of jobs
--          not written because their key is held (kept or replaced), and the id
--          holding it; or {1} when
--          the campaign is not open on this queue yet (join it first), {2, flag} when
--          it is closed here (sealed, cancelled or done): nothing is written; -2 when
--          the jobs would take their group past its max_pending: nothing is written
--          (several groups: {-2, g}, g the first group that would).
--          A campaign not open here is no refusal when every row has a key and every
--          key is held: the call writes nothing and answers {0, 0, 1, id, 2, id, ...}.
local ready = KEYS[1]
local delayed = KEYS[2]
local wake = KEYS[3]
local inflight = KEYS[4]
local stats = KEYS[5]
local campaigns = KEYS[6]
local jobmeta = KEYS[7]
local dedup = KEYS[8]
local dedup_exp = KEYS[9]
local pending = KEYS[10]
local seq = KEYS[11]
local WAIT0 = 12  -- KEYS[WAIT0 + s] is the bitmap of slot s (0..3)
local gready = KEYS[16]
local groups = KEYS[17]
local gwait = KEYS[18]
local gstate = KEYS[19]
local limits = KEYS[20]
local replace = KEYS[21]
local expires = KEYS[22]

local check = ARGV[1] == '1'
local mode = ARGV[2]
local cid = ARGV[4]
local ttl = ARGV[5]
local conflict = ARGV[7]
local scan = tonumber(ARGV[8])
local P0 = 11  -- ARGV[P0 + 2 * i - 1], ARGV[P0 + 2 * i]: row i's entry and key
local multi = ARGV[10] ~= ''

-- a campaign not open here refuses the call, unless the call would write nothing: every
-- row keyed and every key held (a producer run again after the campaign closed)
local refused
if cid ~= '' then
  local f = redis.call('HGET', campaigns, cid .. ':f')
  if not f then refused = {1} elseif f ~= 'open' then refused = {2, f} end
end

local now = now_ms()
if not refused then
  local lapsed = redis.call('ZRANGEBYSCORE', dedup_exp, '-inf', now, 'LIMIT', 0,
    tonumber(ARGV[6]))
  if #lapsed > 0 then
    redis.call('HDEL', dedup, unpack(lapsed))
    redis.call('ZREM', dedup_exp, unpack(lapsed))
    if redis.call('HLEN', replace) > 0 then redis.call('HDEL', replace, unpack(lapsed)) end
  end
end

-- the rows' keys and who holds them now: one HMGET and one ZMSCORE per call, not per row
local n = math.floor((#ARGV - P0) / 2)
local keys, nk = {}, 0
for i = 1, n do
  local key = ARGV[P0 + 2 * i]
  if key ~= '' then nk = nk + 1; keys[nk] = key end
end
local hold = {}  -- key -> id holding it (in Redis, or written by this call)
local lapsed_keys = {}  -- keys whose holder finished more than its ttl ago: free again
if nk > 0 then
  local holders = redis.call('HMGET', dedup, unpack(keys))
  local held = {}
  for j = 1, nk do
    local h = holders[j]
    if h then held[#held + 1] = keys[j]; hold[keys[j]] = h end
  end
  if #held > 0 then
    local lapses = redis.call('ZMSCORE', dedup_exp, unpack(held))
    for j, key in ipairs(held) do
      if lapses[j] and tonumber(lapses[j]) <= now then  -- lapsed: free again
        hold[key] = nil
        lapsed_keys[#lapsed_keys + 1] = key
      end
    end
  end
end

-- several groups: the first of `order` that `per` more jobs would take past its
-- max_pending (one HMGET of the limits, one of the capped groups' counts), or nil
local function quotas_over(order, per)
  if #order == 0 then return nil end
  local f = {}
  for i, x in ipairs(order) do f[i] = x end
  f[#f + 1] = '*'
  local lv = redis.call('HMGET', limits, unpack(f))
  local any = limit_of(lv[#f])
  local capped, caps, nf = {}, {}, {}
  for i, x in ipairs(order) do
    local lim = limit_of(lv[i]) or any
    if lim and lim.max then
      capped[#capped + 1] = x
      caps[#capped] = lim.max
      nf[#capped] = x .. ':n'
    end
  end
  if #capped == 0 then return nil end
  local nv = redis.call('HMGET', gstate, unpack(nf))
  for i, x in ipairs(capped) do
    if (tonumber(nv[i]) or 0) + per[x] > caps[i] then return x end
  end
  return nil
end

local out, nout = {0, 0}, 2
if refused then
  for pos = 1, n do
    local holder = hold[ARGV[P0 + 2 * pos]]
    if not holder then return refused end
    out[nout + 1] = pos
    out[nout + 2] = holder
    nout = nout + 2
  end
  return out
end
local entries, metas, claims, seqs = {}, {}, {}, {}
local ne, nm, nc, ns = 0, 0, 0, 0
-- several groups: the runs of the rows' groups, each written row's group (wg), the
-- groups in order of first written row and their written rows (per)
local runs, wg, order, per = {}, {}, {}, {}
local hc  -- the position of the ':' before the ids (the rows' shared header)
local seq0 = tonumber(ARGV[11])  -- row pos's sequence number is seq0 + pos
if seq0 then seq0 = seq0 - 1 end
local run, left, cur = -1, 0, ''
if multi then
  for rg, c in string.gmatch(ARGV[10], '(%x*):(%d+)') do
    runs[#runs + 1] = rg
    runs[#runs + 1] = tonumber(c)
  end
end
local ready_mode = mode == 'ready'
local prefix = cid .. '\n' .. ttl .. '\n'  -- every jobmeta entry of the call starts so

-- replace / debounce: `old` (an entry) with the body of `e` (its header kept: id,
-- priority, attempt count)
local function swap(old, e)
  local _, _, _, _, hl = parse(old)
  local _, _, _, _, hl2 = parse(e)
  if not hl or not hl2 then return nil end
  return string.sub(old, 1, hl) .. string.sub(e, hl2 + 1)
end
local swapped = {}  -- key -> entry written for it by this call (index into entries)
local sides = {}  -- key -> the entry to find its job by (the replace hash)
local nrep = 0
-- the job `holder` of `key`, if it still waits, takes the body of `e`: true when done
local function take_over(holder, key, e)
  local v = redis.call('HGET', pending, holder)
  if v and v ~= 'r' then  -- delayed (or a retry waiting): re-added with the new body
    local due = redis.call('ZSCORE', delayed, v)
    local new = due and swap(v, e)
    if not new then return false end
    if conflict == 'debounce' and not ready_mode then
      due = tonumber(ARGV[3])
      if mode == 'rel' then due = now + due end
    end
    redis.call('ZADD', delayed, due, new)
    redis.call('ZREM', delayed, v)
    redis.call('HSET', pending, holder, new)
    if not string.find(holder, '~', 1, true) then sides[key] = new end
    return true
  end
  local old = redis.call('HGET', replace, key)
  if not old or string.sub(old, 1, 1) ~= string.sub(e, 1, 1)
      or string.find(holder, '~', 1, true) then
    return false  -- not known, in another priority's list, or in its group's zset
  end
  local at = redis.call('LPOS', ready, old, 'RANK', -1, 'MAXLEN', scan)
  local new = at and swap(old, e)
  if not new then return false end
  redis.call('LSET', ready, at, new)
  sides[key] = new
  return true
end

-- The 256 two-digit hex strings, "00" .. "ff" (index x + 1 for x).
local function hex_pairs()
  local h = {'0', '1', '2', '3', '4', '5', '6', '7', '8', '9', 'a', 'b', 'c', 'd', 'e', 'f'}
  local t = {}
  for a = 1, 16 do
    local ha = h[a]
    for b = 1, 16 do t[16 * (a - 1) + b] = ha .. h[b] end
  end
  return t
end

-- several groups, ready: the grouped rows written in one ZADD (positions in row order:
-- FIFO inside each group), the others in one RPUSH; the groups not in the rotation nor
-- waiting join it at its front (gwake, for all of them at once)
local function push_groups(p)
  local zs, plain = {}, {}
  local ng = 0
  for _, x in ipairs(order) do ng = ng + per[x] end
  if ng > 0 then
    -- positions (13 hex digits) as 11 digits made per 256 rows and the last two
    -- looked up: a string.format per row was a tenth of the call
    local pos = GPOS0 + redis.call('HINCRBY', gstate, 'pos', ng) - ng + 1
    local lo = hex_pairs()
    local low = pos % 256
    local hiv = (pos - low) / 256
    local fmt, hi = string.format, string.format('%011x', hiv)
    local last, lg, pre, nz = 9 - p, nil, nil, 0
    for j = 1, ne do
      local x = wg[j]
      if x == '' then
        plain[#plain + 1] = entries[j]
      else
        if x ~= lg then lg, pre = x, x .. '~' .. last end
        zs[nz + 1] = '0'
        zs[nz + 2] = pre .. hi .. lo[low + 1] .. entries[j]
        nz = nz + 2
        low = low + 1
        if low == 256 then low, hiv = 0, hiv + 1; hi = fmt('%011x', hiv) end
      end
    end
    redis.call('ZADD', gready, unpack(zs))
    gwake_all(groups, gwait, gstate, order)
  else
    plain = entries
  end
  if #plain > 0 then redis.call('RPUSH', ready, unpack(plain)) end
end

for pos = 1, n do
  local e, key = ARGV[P0 - 1 + 2 * pos], ARGV[P0 + 2 * pos]
  if multi then
    while left == 0 do
      run = run + 2
      cur, left = runs[run], runs[run + 1]
      if not cur then return redis.error_reply('ERR group runs shorter than the rows') end
    end
    left = left - 1
  end
  -- the id: the fourth header field (the producer wrote the entry; no pattern needed).
  -- A call's rows share one header (priority, attempt, max attempts), so the id
  -- starts where the last row's did when the byte before it is that row's ':'.
  local c, d = hc, nil
  if c and string.byte(e, c) == 58 then d = string.find(e, ':', c + 1, true) end
  if not d or d == c + 1 then
    local a = string.find(e, ':', 1, true)
    local b = a and string.find(e, ':', a + 1, true)
    c = b and string.find(e, ':', b + 1, true)
    d = c and string.find(e, ':', c + 1, true)
    if not d or d == c + 1 then
      return redis.error_reply('ERR malformed entry at position ' .. pos)
    end
    hc = c
  end
  local id = string.sub(e, c + 1, d - 1)
  local write = not (check and redis.call('HEXISTS', jobmeta, id) == 1)
  if write and key ~= '' then
    local holder = hold[key]
    if holder then
      if conflict ~= 'keep' then
        local j = swapped[key]
        if j then  -- written by this call: the later row wins
          entries[j] = swap(entries[j], e) or entries[j]
        elseif take_over(holder, key, e) then
          nrep = nrep + 1
        end
      end
      out[nout + 1] = pos
      out[nout + 2] = holder
      nout = nout + 2
      write = false
    else
      hold[key] = id
      claims[nc + 1] = key
      claims[nc + 2] = id
      nc = nc + 2
    end
  end
  if write then
    ne = ne + 1
    entries[ne] = e
    if multi then
      wg[ne] = cur
      if cur ~= '' then
        if not per[cur] then order[#order + 1] = cur; per[cur] = 0 end
        per[cur] = per[cur] + 1
      end
    end
    if conflict ~= 'keep' and key ~= '' then swapped[key] = ne end
    metas[nm + 1] = id
    metas[nm + 2] = key == '' and prefix or prefix .. key
    nm = nm + 2
    if ready_mode then
      local s = seq0 and seq0 + pos or seq_of(id)
      if s then ns = ns + 1; seqs[ns] = s end
    end
  end
end
-- the replace hash: the entry each replaced or newly written key's job is found by
-- (a grouped job's is not: it waits in its group's zset, not found by LPOS)
local side, nside = {}, 0
for key, j in pairs(swapped) do
  if not string.find(metas[2 * j - 1], '~', 1, true) then sides[key] = entries[j] end
end
for key, e in pairs(sides) do
  side[nside + 1] = key
  side[nside + 2] = e
  nside = nside + 2
end
if nrep > 0 then redis.call('HINCRBY', stats, 'replaced', nrep) end
if ne == 0 then
  if nside > 0 then redis.call('HSET', replace, unpack(side)) end
  return out
end

-- a group: its quota first (nothing is written past it)
local g = not multi and string.find(metas[1], '~', 1, true) and group_of(metas[1])
if multi then
  local over = quotas_over(order, per)
  if over then return {-2, over} end
elseif g then
  local lim = limit_of(redis.call('HGET', limits, g)) or limit_of(redis.call('HGET', limits, '*'))
  if lim and lim.max
      and tonumber(redis.call('HGET', gstate, g .. ':n') or '0') + ne > lim.max then
    return -2
  end
end

if ready_mode then
  if multi then
    push_groups(tonumber(string.sub(entries[1], 1, 1)))
  elseif g then
    gpush_tail(gready, gstate, g, tonumber(string.sub(entries[1], 1, 1)), entries, 1)
    gwake(groups, gwait, gstate, g)
  else
    redis.call('RPUSH', ready, unpack(entries))
  end
  -- the waiting bits (job_status / cancel): per run of consecutive numbers, not per job
  if #seqs > 0 then set_waiting(seq_top(seq), WAIT0, seqs, 1) end
else
  local due = tonumber(ARGV[3])
  if mode == 'rel' then due = now + due end
  local z, idx = {}, {}
  for j, e in ipairs(entries) do
    z[#z + 1] = due
    z[#z + 1] = e
    idx[#idx + 1] = metas[2 * j - 1]
    idx[#idx + 1] = e
  end
  redis.call('ZADD', delayed, unpack(z))
  redis.call('HSET', pending, unpack(idx))
end
redis.call('HSET', jobmeta, unpack(metas))
-- the deadline: the call's own, or its campaign's when that is earlier
local exp_at, exp_keep = expiry_of(ARGV[9], now)
local camp_at = cid ~= '' and tonumber(redis.call('HGET', campaigns, cid .. ':e') or '')
if camp_at and (not exp_at or camp_at < exp_at) then exp_at = camp_at end
if exp_at then expiry_stamp(expires, exp_at, exp_keep, metas, 2) end
if nside > 0 then redis.call('HSET', replace, unpack(side)) end
if nc > 0 then redis.call('HSET', dedup, unpack(claims)) end
-- a lapsed key taken again is held anew (until its new job settles)
if #lapsed_keys > 0 then redis.call('ZREM', dedup_exp, unpack(lapsed_keys)) end
redis.call('HINCRBY', stats, 'enqueued', ne)
if cid ~= '' then
  redis.call('HINCRBY', campaigns, cid .. ':t', ne)
  redis.call('HINCRBY', campaigns, cid .. ':p', ne)
end
if g then redis.call('HINCRBY', gstate, g .. ':n', ne) end
if multi then gadd(gstate, order, per, ':n') end
leave_wake_token(wake)
out[2] = ne
return out
