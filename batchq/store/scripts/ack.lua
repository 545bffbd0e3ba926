-- ack.lua: finish jobs whose handlers succeeded.
--
-- KEYS[1]  reserved zset
-- KEYS[2]  inflight hash
-- KEYS[3]  stats hash: "succeeded" counts the acks applied, exactly once each
-- KEYS[4]  recovered hash, KEYS[5] started hash: the crash marks (pop.lua), forgotten
-- KEYS[6]  campaigns hash, KEYS[7] jobmeta hash, KEYS[8] dedup hash, KEYS[9] dedup:exp
--          zset: tracked jobs (ids ending "_m") are settled as succeeded (_tracked.lua),
--          a bundle's too (their ids read from its entries: bundle_tracked_ids), all of
--          a call's in one settle
-- KEYS[10] gwait zset, KEYS[11] gstate hash, KEYS[12] wake list: grouped jobs give back
--          their group's running slot and quota count (_groups.lua gsettle)
-- KEYS[13] bundles zset (_bundles.lua)
-- KEYS[14] evconf hash, KEYS[15] events stream: when events are on, one "succeeded"
--          per job settled here (_events.lua)
-- ARGV     leases "<id>:<attempt>", or "<bundle><position>" (_bundles.lua), or
--          jobs of one bundle in one argument, "<bundle>#<position><position>..."
--          (calls.ack makes these: one argument for each run of a bundle's leases, an
--          argument costs a call more than its job's work); at most 1000 jobs per call
-- Returns  the positions (1-based, among all the jobs of the call) of stale leases: ones
--          no longer reserved (the lease expired and the job was handed out again or
--          dead-lettered). A stale ack deletes nothing. When campaigns became due (see
--          settle_tracked), a 0 follows the positions, then their ids.
local reserved = KEYS[1]
local inflight = KEYS[2]
local stats = KEYS[3]
local recovered = KEYS[4]
local started = KEYS[5]
local campaigns = KEYS[6]
local jobmeta = KEYS[7]
local dedup = KEYS[8]
local dedup_exp = KEYS[9]
local gwait = KEYS[10]
local gstate = KEYS[11]
local wake = KEYS[12]
local bundles = KEYS[13]
local evconf = KEYS[14]
local events = KEYS[15]
local ev = ev_open(evconf)
-- bundles' jobs settled, for their events: bundle state -> the positions (two bytes
-- each, as in the leases: no work per job when a whole argument settles), in order
local evb, evo = {}, {}
local function ev_settled(bd, pos)
  local l = evb[bd]
  if not l then
    l = {}
    evb[bd] = l
    evo[#evo + 1] = bd
  end
  l[#l + 1] = pos
end
-- the positions settled of bundles holding tracked jobs (bundle_tracked): bundle state
-- -> positions (numbers), in order; their ids are settled below, and their events are
-- one a job (each names its job's campaign)
local tpos, tord = {}, {}
local function tracked_settled(bd)
  local l = tpos[bd]
  if not l then
    l = {}
    tpos[bd] = l
    tord[#tord + 1] = bd
  end
  return l
end

local singles, at, stale, cache = {}, {}, {}, {}
local settled = 0
local byte, sub, find = string.byte, string.sub, string.find
local i = 0  -- the lease's position among all the call's leases (the reply's)
for _, m in ipairs(ARGV) do
  local _, h = find(m, '^:b%d+%.%d+#')  -- (a position's first byte is never a digit)
  if h then  -- jobs of one bundle, "<bundle>#<position><position>..." (calls.ack)
    -- (bundle_pos and bundle_settle inline: the hot path of a drain)
    local b = sub(m, 1, h - 1)
    local bd = cache[b]
    if bd == nil then bd = bundle_state(inflight, cache, b) end
    local mask = bd and bd[2]
    local tl = bd and bundle_tracked(bd) and tracked_settled(bd)
    local ps = {byte(m, h + 1, -1)}
    local n = 0
    local sj  -- the stale positions' indexes in ps (events on)
    for j = 1, #ps - 1, 2 do
      i = i + 1
      local p = ps[j] * 256 + ps[j + 1]
      if mask and mask[p] == 48 then
        mask[p] = 49
        n = n + 1
        if tl then tl[#tl + 1] = p end
      else
        stale[#stale + 1] = i
        if ev then sj = sj or {}; sj[j] = true end
      end
    end
    if ev and bd and n > 0 and not tl then
      if not sj then
        ev_settled(bd, sub(m, h + 1))  -- every job of the argument
      else  -- (rare) the ones settled, one by one
        for x = 1, #ps - 1, 2 do
          if not sj[x] then ev_settled(bd, sub(m, h + x, h + x + 1)) end
        end
      end
    end
    if bd then bd[3] = bd[3] + n end
    settled = settled + n
  elseif byte(m, 1) == 58 then  -- one bundle job: "<bundle><position>"
    i = i + 1
    local b, p = bundle_pos(m)
    local bd = cache[b]
    if bd == nil then bd = bundle_state(inflight, cache, b) end
    if bundle_settle(bd, p) then
      settled = settled + 1
      if bundle_tracked(bd) then
        local tl = tracked_settled(bd)
        tl[#tl + 1] = p
      elseif ev then
        ev_settled(bd, sub(m, -2))
      end
    else
      stale[#stale + 1] = i
    end
  else
    i = i + 1
    singles[#singles + 1] = m
    at[#at + 1] = i
  end
end
if #cache > 0 then
  bundle_done(bundles, inflight, stats, cache)
  if settled > 0 then redis.call('HINCRBY', stats, 'succeeded', settled) end
  unpin(inflight)
end
local scores = #singles > 0 and redis.call('ZMSCORE', reserved, unpack(singles)) or {}
local live, ids, marked = {}, {}, {}
local nl, nmk = 0, 0
local match = string.match
for i, m in ipairs(singles) do
  if scores[i] then
    -- a live lease is "<id>:<attempt>" (ZMSCORE found it), and no id has ":"
    local id = match(m, '^([^:]+):')
    nl = nl + 1
    live[nl] = m
    ids[nl] = id
    local a, b = byte(id, -2, -1)
    if a == 95 and b == 109 then nmk = nmk + 1; marked[nmk] = id end  -- tracked: "_m"
  else
    stale[#stale + 1] = at[i]
  end
end
if #cache > 0 then table.sort(stale) end
local now = ev and now_ms()
if ev then
  for _, bd in ipairs(evo) do  -- (the packed entries: no work per job)
    local pos = table.concat(evb[bd])
    ev_entry(events, ev, now, 'succeeded', nil, 1, nil, jobmeta, nil,
             type(bd[1]) == 'string' and bd[1] or cmsgpack.pack(bd[1]), pos, #pos / 2)
  end
  for _, bd in ipairs(tord) do  -- (before settle_tracked: the campaigns are read)
    local es = bundle_entries(bd)
    for _, p in ipairs(tpos[bd]) do
      ev_entry(events, ev, now, 'succeeded', es[p], 1, nil, jobmeta)
    end
  end
  if #live > 0 then
    local es = redis.call('HMGET', inflight, unpack(ids))
    for x, e in ipairs(es) do
      ev_entry(events, ev, now, 'succeeded', e or nil, 0, nil, jobmeta, ids[x])
    end
  end
end
if #live > 0 then
  redis.call('ZREM', reserved, unpack(live))
  redis.call('HDEL', inflight, unpack(ids))
  unpin(inflight)
  redis.call('HINCRBY', stats, 'succeeded', #live)
  forget_marks(recovered, started, ids)
  gsettle(gstate, gwait, wake, ids, true)
end
for _, bd in ipairs(tord) do bundle_tracked_ids(bd, tpos[bd], marked) end
if #marked > 0 then
  local due = {}
  settle_tracked(campaigns, jobmeta, dedup, dedup_exp, marked, 's', now or now_ms(), due)
  if #due > 0 then
    stale[#stale + 1] = 0
    for _, cid in ipairs(due) do stale[#stale + 1] = cid end
  end
end
ev_close(evconf, events, ev, now)
return stale
