-- reroute.lua: jobs of a task bound to an open circuit breaker (batchq/flow/breaker.py),
-- taken from their reservation with their attempt refunded, in one step each:
-- * held: back to the delayed set, due when the breaker half-opens (ARGV[1] from now);
-- * rerouted: the same job (same id, so the same campaign, group and dedup key) with
--   a new body, its fallback task's, at the head of its ready list (a grouped job: of
--   its group), counted in the stats hash ("rerouted:<task>"). The lease and the
--   fallback's entry change in the same script: exactly one of the two ever runs.
--
-- KEYS[1]  reserved zset       KEYS[5]  wake list      KEYS[9..18] ready lists, 9 to 0
-- KEYS[2]  inflight hash       KEYS[6]  started hash   KEYS[19] gready zset
-- KEYS[3]  delayed zset        KEYS[7]  stats hash     KEYS[20] groups zset
-- KEYS[4]  pending hash        KEYS[8]  bundles zset   KEYS[21] gwait zset
--                                                      KEYS[22] gstate hash
-- KEYS[23] jobmeta hash: read only, a tracked job's campaign for its event
-- KEYS[24] evconf hash, KEYS[25] events stream: when events are on, a rerouted job
--          writes "rerouted" (task: the fallback's; error: the task it had), a held one
--          "held" (error: "breaker") (_events.lua)
-- ARGV[1]  hold in ms: a held job is due that long from now
-- ARGV[2..] triples: lease ("<id>:<attempt>" or a bundle job's), the job's task (its
--          "rerouted" count), the fallback's msgpack body ("" to hold the job)
-- Returns  {held, rerouted} (stale leases are skipped)
local reserved = KEYS[1]
local inflight = KEYS[2]
local delayed = KEYS[3]
local pending = KEYS[4]
local wake = KEYS[5]
local started = KEYS[6]
local stats = KEYS[7]
local bundles = KEYS[8]
local READY9 = 9  -- KEYS[READY9 + 9 - p] is the ready list of priority p
local gready = KEYS[19]
local groups = KEYS[20]
local gwait = KEYS[21]
local gstate = KEYS[22]
local jobmeta = KEYS[23]
local evconf = KEYS[24]
local events = KEYS[25]

local function ready_key(p)
  return KEYS[READY9 + 9 - p]
end

local now = now_ms()
local due = now + (tonumber(ARGV[1]) or 0)
local marks = redis.call('HLEN', started) > 0
local ev = ev_open(evconf)
local held, moved = 0, 0
local back, woken = {}, {}
local cache = {}  -- bundles met (_bundles.lua)
for i = 2, #ARGV - 2, 3 do
  local m, task, body = ARGV[i], ARGV[i + 1], ARGV[i + 2]
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
  local p, hl
  if r then
    local pr, _, _, _, h = parse(r)
    p, hl = pr, h
  end
  if p then
    if body == '' then
      redis.call('ZADD', delayed, due, r)
      redis.call('HSET', pending, id, r)
      held = held + 1
      ev_entry(events, ev, now, 'held', e, 0, 'breaker', jobmeta, id)
    else
      local new = string.sub(r, 1, hl) .. body
      local g = string.find(id, '~', 1, true) and group_of(id)
      if g then
        gpush(gready, gstate, {{g, p, new}}, true)
        woken[g] = true
      else
        redis.call('LPUSH', ready_key(p), new)
      end
      redis.call('HSET', pending, id, 'r')
      redis.call('HINCRBY', stats, 'rerouted:' .. task, 1)
      moved = moved + 1
      ev_entry(events, ev, now, 'rerouted', new, 0, task, jobmeta, id)
    end
    if single then
      redis.call('ZREM', reserved, m)
      redis.call('HDEL', inflight, id)
    end
    if marks then redis.call('HDEL', started, id) end
    back[#back + 1] = id
  end
end
if #cache > 0 then bundle_done(bundles, inflight, stats, cache) end
for g in pairs(woken) do gwake(groups, gwait, gstate, g) end
if #back > 0 then unpin(inflight) end
gsettle(gstate, gwait, wake, back, false)
if #back > 0 then leave_wake_token(wake) end
ev_close(evconf, events, ev, now)
return {held, moved}
