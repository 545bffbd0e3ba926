-- _tracked.lua: campaign members and jobs with a dedup key.

-- Tracked jobs: campaign members and jobs with a dedup key. Their ids end in "_m"
-- (producer: codec.TRACKED_SUFFIX) and they have a jobmeta entry
-- "<campaign>\n<key ttl ms>\n<dedup key>" until settled. Plain jobs pay one string
-- compare here and no Redis call. (pop.lua's bundling loop checks the same two bytes
-- in the entry, inline.)
local function tracked(id)
  local a, b = string.byte(id, -2, -1)
  return a == 95 and b == 109  -- "_m", without making a string
end

-- {id, campaign, key ttl ms, key} of the ids that still have a jobmeta entry.
local function meta_of(jobmeta, ids)
  local out = {}
  if #ids == 0 then return out end
  local vals = redis.call('HMGET', jobmeta, unpack(ids))
  for i, v in ipairs(vals) do
    if v then
      local cid, ttl, key = string.match(v, '^([^\n]*)\n(%d*)\n(.*)$')
      if cid then out[#out + 1] = {ids[i], cid, tonumber(ttl) or 0, key} end
    end
  end
  return out
end

-- Settle tracked jobs for good: outcome 's' (succeeded), 'd' (dead) or 'c' (cancelled).
-- Counted by membership: only jobs whose jobmeta entry is still there count, and the
-- entry goes, so a redelivered or double-acked job counts once. A dedup key that still
-- names its job starts to lapse (now + its ttl).
-- Campaigns whose pending count on this queue reaches 0 while closed here (sealed or
-- cancelled) are appended to `due`: the caller's process then tries to complete them.
-- known (optional): id -> jobmeta entry the caller read in this call (not read again).
local function settle_tracked(campaigns, jobmeta, dedup, dedup_exp, ids, outcome, now, due,
                              known)
  if #ids == 0 then return end
  local vals
  if known then
    local rest, at = {}, {}
    vals = {}
    for i, id in ipairs(ids) do
      local v = known[id]
      if v then
        vals[i] = v
      else
        rest[#rest + 1] = id
        at[#at + 1] = i
        vals[i] = false
      end
    end
    if #rest > 0 then
      local got = redis.call('HMGET', jobmeta, unpack(rest))
      for j, i in ipairs(at) do vals[i] = got[j] end
    end
  else
    vals = redis.call('HMGET', jobmeta, unpack(ids))
  end
  local gone, per, order, keys, kids, kttl = {}, {}, {}, {}, {}, {}
  local ng, nk = 0, 0
  -- the jobs of one campaign without dedup keys share one entry: a job whose entry is
  -- the previous one's (one pointer compare: Lua strings are interned) is not parsed
  local last, last_cid = nil, nil
  local match = string.match
  for i = 1, #ids do
    local v = vals[i]
    if v and v == last then
      ng = ng + 1
      gone[ng] = ids[i]
      if last_cid then per[last_cid] = per[last_cid] + 1 end
    elseif v then
      -- one match: campaign, key ttl, key (an entry may stop after the first newline)
      local cid, ttl, key = match(v, '^([^\n]*)\n([^\n]*)\n?(.*)$')
      if cid then
        ng = ng + 1
        gone[ng] = ids[i]
        last_cid = nil
        if cid ~= '' then
          if not per[cid] then order[#order + 1] = cid; per[cid] = 0 end
          per[cid] = per[cid] + 1
          last_cid = cid
        end
        if key ~= '' then  -- a dedup key follows the second newline
          nk = nk + 1
          keys[nk] = key
          kids[nk] = ids[i]
          kttl[nk] = tonumber(ttl) or 0
          last = nil  -- an entry with a key is one job's own
        else
          last = v
        end
      end
    end
  end
  for _, cid in ipairs(order) do
    local n = per[cid]
    redis.call('HINCRBY', campaigns, cid .. ':' .. outcome, n)
    if redis.call('HINCRBY', campaigns, cid .. ':p', -n) <= 0 then
      local f = redis.call('HGET', campaigns, cid .. ':f')
      if f == 'sealed' or f == 'cancelled' then due[#due + 1] = cid end
    end
  end
  if #keys > 0 then
    local cur = redis.call('HMGET', dedup, unpack(keys))
    local z, nz = {}, 0
    for i = 1, nk do
      if cur[i] == kids[i] then
        z[nz + 1] = now + kttl[i]
        z[nz + 2] = keys[i]
        nz = nz + 2
      end
    end
    if nz > 0 then redis.call('ZADD', dedup_exp, unpack(z)) end
  end
  if ng > 0 then redis.call('HDEL', jobmeta, unpack(gone)) end
end
