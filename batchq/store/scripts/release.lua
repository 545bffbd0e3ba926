-- release.lua: give back reserved jobs that did not run (or were interrupted by a
-- shutdown, or whose handler raised RateLimited): they return to the head of their ready
-- list (a grouped job: of its group) at once, their attempt refunded.
--
-- KEYS[1]  reserved zset         KEYS[3]  wake list
-- KEYS[2]  inflight hash         KEYS[4..13]  ready lists, priority 9 down to 0
-- KEYS[14] started hash: a given-back job did not crash its worker, its mark goes
--          (its "recovered" mark stays: it still runs alone next time)
-- KEYS[15] pending hash: a given-back job is ready again (job_status, cancel.lua)
-- KEYS[16] gready zset, KEYS[17] groups zset, KEYS[18] gwait zset, KEYS[19] gstate
--          hash: a grouped job goes back to its group and gives back its running slot
-- KEYS[20] stats hash: "bundled" (_bundles.lua bundle_done), KEYS[21] bundles zset
-- KEYS[22] evconf hash, KEYS[23] events stream: when events are on, each hold set here
--          writes "held" (_events.lua); a job given back writes nothing (its
--          next pop writes "started" again)
-- ARGV[1]  hold in ms (0: none): each given-back job's group (or, for a job without a
--          group, the whole queue) starts no job until now + hold (RateLimited, its
--          reason in gstate "<g>:why", hold.lua); a longer hold already set is kept
-- ARGV[2..] leases "<id>:<attempt>" or "<bundle><position>" (_bundles.lua), in
--          the order the jobs were popped
-- Returns  how many were given back (stale leases are skipped).
local reserved = KEYS[1]
local inflight = KEYS[2]
local wake = KEYS[3]
local READY9 = 4  -- KEYS[READY9 + 9 - p] is the ready list of priority p
local started = KEYS[14]
local pending = KEYS[15]
local gready = KEYS[16]
local groups = KEYS[17]
local gwait = KEYS[18]
local gstate = KEYS[19]
local stats = KEYS[20]
local bundles = KEYS[21]
local evconf = KEYS[22]
local events = KEYS[23]

local function ready_key(p)
  return KEYS[READY9 + 9 - p]
end

local hold = tonumber(ARGV[1]) or 0
local now = now_ms()
local ev = hold > 0 and ev_open(evconf)

-- hold `g` (a group, or QUEUE) until now + hold, keeping a longer hold
local function hold_off(g)
  local cur = tonumber(redis.call('ZSCORE', gwait, g) or '0')
  if cur >= BLOCKED or cur < now + hold then
    redis.call('ZADD', gwait, now + hold, g)
    redis.call('HSET', gstate, g .. ':why', 'RateLimited@' .. (now + hold))  -- hold.lua
    ev_put(events, ev, now, 'held', nil, 'RateLimited', g, now + hold)
  end
  if g ~= QUEUE then redis.call('ZREM', groups, g) end
end

local marks = redis.call('HLEN', started) > 0
local n = 0
local back, woken = {}, {}
local plain = false  -- a job without a group went back: a hold holds the whole queue
local cache = {}  -- bundles met (_bundles.lua)
for i = #ARGV, 2, -1 do
  local m = ARGV[i]
  local single = string.byte(m, 1) ~= 58  -- ":": a bundle's job
  local id, e, r
  if single then
    id = member_id(m)
    e = id and redis.call('ZSCORE', reserved, m) and redis.call('HGET', inflight, id)
    if e then
      local p, a, mx, _, hl = parse(e)
      if p then r = with_attempt(e, p, math.max(a - 1, 0), mx, id, hl) end
    end
  else
    local b, pos = bundle_pos(m)
    id, e, r = bundle_job(bundle_state(inflight, cache, b), pos)
  end
  if r then
    local p = tonumber(string.sub(r, 1, 1))
    local g = string.find(id, '~', 1, true) and group_of(id)
    if g then
      gpush(gready, gstate, {{g, p, r}}, true)
      woken[g] = true
    else
      redis.call('LPUSH', ready_key(p), r)
      plain = true
    end
    if single then
      redis.call('ZREM', reserved, m)
      redis.call('HDEL', inflight, id)
    end
    if marks then redis.call('HDEL', started, id) end
    redis.call('HSET', pending, id, 'r')
    back[#back + 1] = id
    n = n + 1
  end
end
if #cache > 0 then bundle_done(bundles, inflight, stats, cache) end
if plain and hold > 0 then hold_off(QUEUE) end
for g in pairs(woken) do
  if hold > 0 then hold_off(g) else gwake(groups, gwait, gstate, g) end
end
if n > 0 then unpin(inflight) end
gsettle(gstate, gwait, wake, back, false)
if n > 0 then leave_wake_token(wake) end
ev_close(evconf, events, ev, now)
return n
