-- _bundles.lua: the jobs of one pop leased together.

-- Bundles (pop.lua, ARGV[6]): the jobs of one pop leased together (tracked ones too:
-- settled by id, read from the entries; grouped ones never). One member
-- ":b<n>.<ms>" in the bundles zset (its deadline; apart from the reserved zset, so a
-- worker from before bundles, whose reaper reads only reserved, never takes one), and
-- two fields of that name in the inflight hash: the name itself holds the entries as
-- popped (their attempt NOT counted: the worker counts it, and a bundle job's counted
-- entry is count_attempt of its raw one), the name .. "~" a mask, one byte a job, "0"
-- running, "1" settled. The bundle goes with its last job. The name has no id in it
-- (ids have no ':'), and a name is never used twice (a counter and the server time),
-- so a late ack of a reaped bundle finds nothing. A bundle job's lease is the name and
-- its position (1-based) in two bytes, big-endian: read with one string.sub and one
-- string.byte (a pattern with captures cost an ack 2.4 times as much). A lease that
-- names no live bundle, or a position it does not have, is stale.
local function bundle_pos(m)
  local hi, lo = string.byte(m, -2, -1)
  return string.sub(m, 1, -3), (hi or 0) * 256 + (lo or 0)
end

-- A bundle's state for one call: {entries (packed until needed), mask bytes, jobs
-- settled}, or false when it is gone (reaped, or settled). Read once per call (cache:
-- name -> state, and the names in order). The mask field is deleted on the first read:
-- a delete is never refused on a full Redis, so the writes after it are let through
-- (as the per-job scripts' ZREM first); bundle_done writes it back, or deletes the
-- bundle with its last job.
local function bundle_state(inflight, cache, b)
  local bd = cache[b]
  if bd == nil then
    local v = redis.call('HMGET', inflight, b, b .. '~')
    bd = false
    -- (a name is ":b" and digits: not the pin, nor a mask)
    if v[1] and string.byte(b, 2) == 98 and string.byte(b, -1) ~= 126 then
      -- no mask (a script stopped by an error between its delete and write-back): all
      -- its jobs count as running, to run again rather than be lost
      local es = not v[2] and cmsgpack.unpack(v[1])
      if v[2] or type(es) == 'table' then
        redis.call('HDEL', inflight, b .. '~')
        bd = {es or v[1], {string.byte(v[2] or string.rep('0', #es), 1, -1)}, 0}
      end
    end
    cache[#cache + 1] = b
    cache[b] = bd
  end
  return bd
end

-- Settle the job at position p of bundle state bd: true when it was running.
local function bundle_settle(bd, p)
  if not bd or bd[2][p] ~= 48 then return false end
  bd[2][p] = 49
  bd[3] = bd[3] + 1
  return true
end

-- The running job at position p of bundle state bd, now settled in bd: its id, its
-- entry with the attempt counted, its raw entry; nil when it was settled already.
local function bundle_job(bd, p)
  if not bundle_settle(bd, p) then return nil end
  if type(bd[1]) == 'string' then bd[1] = cmsgpack.unpack(bd[1]) end
  local raw = bd[1][p]
  local id, e = count_attempt(raw)
  return id, e, raw
end

-- Does bundle state bd hold tracked jobs (ids ending "_m": campaign members, dedup
-- keys)? Found once per bundle per call (bd[4]) by one plain find of "_m:" in its
-- packed entries (an id is followed by ":", and has none itself), so a bundle of plain
-- jobs is never unpacked for it; a body that spells "_m:" costs an unpack, no more.
local function bundle_tracked(bd)
  local t = bd[4]
  if t == nil then
    t = type(bd[1]) ~= 'string' or string.find(bd[1], '_m:', 1, true) ~= nil
    bd[4] = t
  end
  return t
end

-- The entries of bundle state bd as popped, unpacked once per call (bd[5]; bd[1] stays
-- as it is: packed, for the events).
local function bundle_entries(bd)
  local es = bd[5]
  if not es then
    es = type(bd[1]) == 'string' and cmsgpack.unpack(bd[1]) or bd[1]
    bd[5] = es
  end
  return es
end

-- The ids of the tracked jobs at positions ps of bundle state bd, appended to out (one
-- match a job: its header was checked when it was popped; three plain finds and a sub
-- cost this loop about half as much again).
local function bundle_tracked_ids(bd, ps, out)
  local es = bundle_entries(bd)
  local match = string.match
  local n = #out
  for _, p in ipairs(ps) do
    local id = match(es[p], '^%d:%d+:%d+:([^:]*_m):')
    if id then
      n = n + 1
      out[n] = id
    end
  end
end

-- Write back what a call settled: each bundle of `cache` keeps its new mask, or goes
-- (its bundles member, both fields) with its last job; the stats field "bundled" (the
-- running jobs of live bundles) follows, so a reader counts reserved jobs as
-- ZCARD(reserved) + bundled (stats.py).
local function bundle_done(bundles, inflight, stats, cache)
  local settled = 0
  for _, b in ipairs(cache) do
    local bd = cache[b]
    if bd then
      settled = settled + bd[3]
      local mask = string.char(unpack(bd[2]))
      if string.find(mask, '0', 1, true) then
        redis.call('HSET', inflight, b .. '~', mask)
      else
        redis.call('HDEL', inflight, b)
        redis.call('ZREM', bundles, b)
      end
    end
  end
  if settled > 0 then redis.call('HINCRBY', stats, 'bundled', -settled) end
end

-- Is job `id` running (leased: its own lease, or a running job of a bundle)? Bundles
-- are few (one per pop in flight) and each is searched as one string; at most 10,000
-- fields of inflight are read (HSCAN). For status and the retry checks, never a hot path.
local function is_running(inflight, id)
  if redis.call('HEXISTS', inflight, id) == 1 then return true end
  local cursor, looked = '0', 0
  repeat
    local r = redis.call('HSCAN', inflight, cursor, 'MATCH', ':b*', 'COUNT', 100)
    cursor = r[1]
    local kv = r[2]
    for i = 1, #kv, 2 do
      -- a bundle's entries (its mask's name ends in "~"), holding the id somewhere
      if string.byte(kv[i], -1) ~= 126 and string.find(kv[i + 1], id, 1, true) then
        for pos, e in ipairs(cmsgpack.unpack(kv[i + 1])) do
          local _, _, _, jid = header(e)
          if jid == id then
            local mask = redis.call('HGET', inflight, kv[i] .. '~')
            if mask and string.byte(mask, pos) == 48 then return true end
          end
        end
      end
    end
    looked = looked + 100
  until cursor == '0' or looked >= 10000
  return false
end

-- Which of `ids` are running jobs of live bundles: id -> true. One pass over the
-- bundles' fields of inflight (HSCAN, at most 10,000 fields read, as is_running); a
-- bundle without its mask counts all its jobs running (bundle_state). For the expiry
-- sweep (_expiry.lua), never a hot path.
local function bundled_running(inflight, ids)
  local want, found = {}, {}
  for _, id in ipairs(ids) do want[id] = true end
  local cursor, looked = '0', 0
  repeat
    local r = redis.call('HSCAN', inflight, cursor, 'MATCH', ':b*', 'COUNT', 100)
    cursor = r[1]
    local kv = r[2]
    for i = 1, #kv, 2 do
      local es = string.byte(kv[i], -1) ~= 126 and cmsgpack.unpack(kv[i + 1])
      local mask
      for pos, e in ipairs(type(es) == 'table' and es or {}) do
        local _, _, _, jid = header(e)
        if jid and want[jid] then
          mask = mask or redis.call('HGET', inflight, kv[i] .. '~') or ''
          if mask == '' or string.byte(mask, pos) == 48 then found[jid] = true end
        end
      end
    end
    looked = looked + 100
  until cursor == '0' or looked >= 10000
  return found
end
