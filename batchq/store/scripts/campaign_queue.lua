-- campaign_queue.lua: one campaign's flag and counters on one queue.
--
-- KEYS[1]  the queue's campaigns hash ("<id>:f" flag, "<id>:g" generation, counters
--          "<id>:t" total, ":p" pending, ":s" succeeded, ":d" dead, ":c" cancelled,
--          ":x" expired; ":e" its jobs' deadline (Unix ms: enqueue_tracked.lua stamps
--          each job with it);
--          "~cancelled": how many campaigns are cancelled here and not done, so
--          pop.lua looks up flags only while that is above 0)
-- KEYS[2]  the queue's reserved zset, KEYS[3] its jobmeta hash: "cancel" counts the
--          campaign's jobs holding a lease (they run; the rest never will)
-- KEYS[4]  inflight hash, KEYS[5] bundles zset: "cancel" counts the campaign's running
--          jobs of bundles too (_bundles.lua)
-- KEYS[6]  evconf hash, KEYS[7] events stream: when events are on, "done" writes
--          "campaign_done" once (error: the final counts here) (_events.lua)
-- ARGV[1]  campaign id
-- ARGV[2]  "read"; "open" (a producer joins: opens the flag for generation ARGV[3]
--          unless it is closed for that generation already); "seal" (open -> sealed);
--          "cancel" (open or sealed -> cancelled); "done" (the campaign completed: its
--          counters here go, the flag stays "done" so a late producer is refused)
-- ARGV[3]  the campaign's generation (created_ms) for "open"
-- ARGV[4]  "cancel": at most this many leases are looked at, and as many jobs of
--          bundles (bounds the loops; they hold only what the fleet runs or prefetched)
-- ARGV[5]  "open": the campaign's jobs' deadline (Unix ms), "" for none
-- Returns  {flag or "", t, p, s, d, c, leased, x} after the change (leased: "cancel"
--          only, else 0).
local campaigns = KEYS[1]
local reserved = KEYS[2]
local jobmeta = KEYS[3]
local inflight = KEYS[4]
local bundles = KEYS[5]
local evconf = KEYS[6]
local events = KEYS[7]

local cid, mode = ARGV[1], ARGV[2]
local fk, gk = cid .. ':f', cid .. ':g'
local names = {'t', 'p', 's', 'd', 'c', 'x', 'e'}
local f = redis.call('HGET', campaigns, fk)
local leased = 0
if mode == 'open' then
  if redis.call('HGET', campaigns, gk) ~= ARGV[3] then
    -- first join of this generation (a campaign id used again after its record
    -- expired starts from zero)
    if f == 'cancelled' then redis.call('HINCRBY', campaigns, '~cancelled', -1) end
    for _, n in ipairs(names) do redis.call('HDEL', campaigns, cid .. ':' .. n) end
    redis.call('HSET', campaigns, fk, 'open', gk, ARGV[3])
    if (ARGV[5] or '') ~= '' then redis.call('HSET', campaigns, cid .. ':e', ARGV[5]) end
  end
elseif mode == 'seal' then
  if f == 'open' or not f then redis.call('HSET', campaigns, fk, 'sealed') end
elseif mode == 'cancel' then
  if f ~= 'done' and f ~= 'cancelled' then
    redis.call('HSET', campaigns, fk, 'cancelled')
    redis.call('HINCRBY', campaigns, '~cancelled', 1)
  end
  local ids = {}
  local function count(id)
    if tracked(id) then ids[#ids + 1] = id end
    if #ids == 1000 then
      for _, x in ipairs(meta_of(jobmeta, ids)) do
        if x[2] == cid then leased = leased + 1 end
      end
      ids = {}
    end
  end
  local most = tonumber(ARGV[4])
  for _, m in ipairs(redis.call('ZRANGE', reserved, 0, most - 1)) do
    local id = member_id(m)
    if id then count(id) end
  end
  -- the running jobs of bundles (read only; a bundle of plain jobs is not unpacked)
  local looked = 0
  for _, b in ipairs(redis.call('ZRANGE', bundles, 0, most - 1)) do
    if looked >= most then break end
    local v = redis.call('HMGET', inflight, b, b .. '~')
    local bd = v[1] and {v[1]}
    looked = looked + (v[2] and #v[2] or 1)
    if bd and bundle_tracked(bd) then
      local es = bundle_entries(bd)
      if type(es) == 'table' then
        local run, got = {}, {}
        for p = 1, #es do  -- running: "0" (no mask: all, as bundle_state)
          if not v[2] or string.byte(v[2], p) == 48 then run[#run + 1] = p end
        end
        bundle_tracked_ids(bd, run, got)
        for _, id in ipairs(got) do count(id) end
      end
    end
  end
  for _, x in ipairs(meta_of(jobmeta, ids)) do
    if x[2] == cid then leased = leased + 1 end
  end
elseif mode == 'done' then
  if f == 'cancelled' then redis.call('HINCRBY', campaigns, '~cancelled', -1) end
  local ev = f ~= 'done' and ev_open(evconf)
  if ev then
    local c = redis.call('HMGET', campaigns, cid .. ':s', cid .. ':d', cid .. ':c')
    local now = now_ms()
    ev_put(events, ev, now, 'campaign_done', cid, 'succeeded=' ..
           (c[1] or 0) .. ' dead=' .. (c[2] or 0) .. ' cancelled=' .. (c[3] or 0))
    ev_close(evconf, events, ev, now)
  end
  redis.call('HSET', campaigns, fk, 'done')
  for _, n in ipairs(names) do redis.call('HDEL', campaigns, cid .. ':' .. n) end
end
local out = {redis.call('HGET', campaigns, fk) or ''}
for i = 1, 5 do
  out[#out + 1] = tonumber(redis.call('HGET', campaigns, cid .. ':' .. names[i]) or '0')
end
out[#out + 1] = leased
out[#out + 1] = tonumber(redis.call('HGET', campaigns, cid .. ':x') or '0')
return out
