-- ack_result.lua: finish jobs whose handlers succeeded and keep their return values
-- (tasks with result_ttl_s; plain acks go through ack.lua and pay nothing for this).
--
-- KEYS[1]  reserved zset
-- KEYS[2]  inflight hash
-- KEYS[3]  stats hash: "succeeded" counts the acks applied, exactly once each
-- KEYS[4]  recovered hash, KEYS[5] started hash: the crash marks (pop.lua), forgotten
-- KEYS[6]  done: prefix of the per-job channels; each applied ack is announced with "s"
--          on "<done>:<id>" after its result is written (result waiters wake), only
--          while KEYS[7] exists
-- KEYS[7]  waiters flag: set (with a TTL) by processes waiting for results of this queue
-- KEYS[8]  campaigns hash, KEYS[9] jobmeta hash, KEYS[10] dedup hash, KEYS[11] dedup:exp
--          zset: tracked jobs (ids ending "_m") are settled as succeeded (_tracked.lua)
-- KEYS[12] gwait zset, KEYS[13] gstate hash, KEYS[14] wake list: grouped jobs give back
--          their group's running slot and quota count (_groups.lua gsettle)
-- KEYS[15] bundles zset (_bundles.lua)
-- KEYS[16] evconf hash, KEYS[17] events stream: when events are on, one "succeeded"
--          per job settled here (_events.lua)
-- The keys after those: the result key of each job, in the order of the triples below
-- (KEYS[RESULTS + j] belongs to the j-th triple).
-- ARGV     triples: lease "<id>:<attempt>" or "<bundle><position>"
--          (_bundles.lua), result TTL in ms, msgpack result (at most
--          1000 triples per call)
-- Returns  the positions (1-based, counting triples) of stale leases: ones no longer
--          reserved. A stale ack writes nothing, not even its result. When campaigns
--          became due (see settle_tracked), a 0 follows the positions, then their ids.
--          An error reply, before anything is written, when a TTL is not a whole number
--          of ms in 1..2^53 (Redis would refuse the SET half-way through the call, after
--          a bundle's mask was taken: its settled jobs would count as running again).
local reserved = KEYS[1]
local inflight = KEYS[2]
local stats = KEYS[3]
local recovered = KEYS[4]
local started = KEYS[5]
local done = KEYS[6]
local waiters = KEYS[7]
local campaigns = KEYS[8]
local jobmeta = KEYS[9]
local dedup = KEYS[10]
local dedup_exp = KEYS[11]
local gwait = KEYS[12]
local gstate = KEYS[13]
local wake = KEYS[14]
local bundles = KEYS[15]
local evconf = KEYS[16]
local events = KEYS[17]
local RESULTS = 17  -- KEYS[RESULTS + j] is the result key of the j-th triple

for i = 2, #ARGV - 1, 3 do
  local ttl = tonumber(ARGV[i])
  if not ttl or ttl < 1 or ttl > 9007199254740992 or ttl % 1 ~= 0 then
    return redis.error_reply('ERR result TTL ' .. ARGV[i] .. ' ms is not a whole number '
      .. 'of ms in 1..2^53 (triple ' .. (i + 1) / 3 .. ')')
  end
end

local leases, at = {}, {}  -- per-job leases and their triple numbers
local ev = ev_open(evconf)
local now = ev and now_ms()
local stale, ids, live, cache = {}, {}, {}, {}
local settled = 0
local j = 0
for i = 1, #ARGV - 2, 3 do
  j = j + 1
  local m = ARGV[i]
  if string.byte(m, 1) == 58 then  -- ":": a bundle's job (_bundles.lua)
    local b, p = bundle_pos(m)
    local id, e = bundle_job(bundle_state(inflight, cache, b), p)
    if id then
      ev_entry(events, ev, now, 'succeeded', e, 0, nil, jobmeta, id)
      redis.call('SET', KEYS[RESULTS + j], ARGV[i + 2], 'PX', ARGV[i + 1])
      ids[#ids + 1] = id
      settled = settled + 1
    else
      stale[#stale + 1] = j
    end
  else
    leases[#leases + 1] = m
    at[#at + 1] = j
  end
end
if #cache > 0 then bundle_done(bundles, inflight, stats, cache) end
local scores = #leases > 0 and redis.call('ZMSCORE', reserved, unpack(leases)) or {}
for x, m in ipairs(leases) do
  j = at[x]
  local id = member_id(m)
  if id and scores[x] then
    -- the result first (write before delete): a full Redis refuses it before anything
    -- else changes, and the lease stays to be acked again
    redis.call('SET', KEYS[RESULTS + j], ARGV[3 * j], 'PX', ARGV[3 * j - 1])
    live[#live + 1] = m
    ids[#ids + 1] = id
  else
    stale[#stale + 1] = j
  end
end
if #cache > 0 then table.sort(stale) end
if settled > 0 then redis.call('HINCRBY', stats, 'succeeded', settled) end
if #live > 0 then
  if ev then
    local lids = {unpack(ids, #ids - #live + 1)}
    local es = redis.call('HMGET', inflight, unpack(lids))
    for x, e in ipairs(es) do
      ev_entry(events, ev, now, 'succeeded', e or nil, 0, nil, jobmeta, lids[x])
    end
  end
  redis.call('ZREM', reserved, unpack(live))
  redis.call('HDEL', inflight, unpack(ids, #ids - #live + 1))
  redis.call('HINCRBY', stats, 'succeeded', #live)
end
if #cache > 0 or #live > 0 then unpin(inflight) end
if #ids > 0 then
  forget_marks(recovered, started, ids)
  gsettle(gstate, gwait, wake, ids, true)
  if redis.call('EXISTS', waiters) == 1 then
    for _, id in ipairs(ids) do
      redis.call('PUBLISH', done .. ':' .. id, 's')
    end
  end
  local marked = {}
  for _, id in ipairs(ids) do
    if tracked(id) then marked[#marked + 1] = id end
  end
  if #marked > 0 then
    local due = {}
    settle_tracked(campaigns, jobmeta, dedup, dedup_exp, marked, 's', now or now_ms(), due)
    if #due > 0 then
      stale[#stale + 1] = 0
      for _, cid in ipairs(due) do stale[#stale + 1] = cid end
    end
  end
end
ev_close(evconf, events, ev, now)
return stale
