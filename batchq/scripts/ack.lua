-- ack.lua: finish jobs whose handlers succeeded.
--
-- KEYS[1]  reserved zset
-- KEYS[2]  inflight hash
-- KEYS[3]  stats hash: "succeeded" counts the acks applied, exactly once each
-- KEYS[4]  recovered hash, KEYS[5] started hash: the crash marks (pop.lua), forgotten
-- KEYS[6]  campaigns hash, KEYS[7] jobmeta hash, KEYS[8] dedup hash, KEYS[9] dedup:exp
--          zset: tracked jobs (ids ending "_m") are settled as succeeded (_lib.lua)
-- KEYS[10] gwait zset, KEYS[11] gstate hash, KEYS[12] wake list: grouped jobs give back
--          their group's running slot and quota count (_lib.lua gsettle)
-- KEYS[13] bundles zset (_lib.lua "Bundles")
-- ARGV     leases "<id>:<attempt>", or "<bundle><position>" (_lib.lua "Bundles"); at
--          most 1000 per call
-- Returns  the positions (1-based) of stale leases: ones no longer reserved (the lease
--          expired and the job was handed out again or dead-lettered). A stale ack
--          deletes nothing. When campaigns became due (see settle_tracked), a 0 follows
--          the positions, then their ids.
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

local singles, at, stale, cache = {}, {}, {}, {}
local settled = 0
local byte, sub = string.byte, string.sub
for i, m in ipairs(ARGV) do
  if byte(m, 1) == 58 then  -- ":": a bundle's job (bundle_pos and bundle_settle inline:
    -- the hot path of a drain, where a call per lease cost as much as the rest)
    local b = sub(m, 1, -3)
    local bd = cache[b]
    if bd == nil then bd = bundle_state(inflight, cache, b) end
    local hi, lo = byte(m, -2, -1)
    local p = hi * 256 + (lo or 0)
    if bd and bd[2][p] == 48 then
      bd[2][p] = 49
      bd[3] = bd[3] + 1
      settled = settled + 1
    else
      stale[#stale + 1] = i
    end
  else
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
for i, m in ipairs(singles) do
  if scores[i] then
    live[#live + 1] = m
    ids[#ids + 1] = member_id(m)
    if tracked(ids[#ids]) then marked[#marked + 1] = ids[#ids] end
  else
    stale[#stale + 1] = at[i]
  end
end
if #cache > 0 then table.sort(stale) end
if #live > 0 then
  redis.call('ZREM', reserved, unpack(live))
  redis.call('HDEL', inflight, unpack(ids))
  unpin(inflight)
  redis.call('HINCRBY', stats, 'succeeded', #live)
  forget_marks(recovered, started, ids)
  gsettle(gstate, gwait, wake, ids, true)
  if #marked > 0 then
    local due = {}
    settle_tracked(campaigns, jobmeta, dedup, dedup_exp, marked, 's', now_ms(), due)
    if #due > 0 then
      stale[#stale + 1] = 0
      for _, cid in ipairs(due) do stale[#stale + 1] = cid end
    end
  end
end
return stale
