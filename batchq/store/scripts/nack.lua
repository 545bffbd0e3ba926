-- nack.lua: failed jobs go back to the delayed set for a retry, or to the dead store.
--
-- KEYS[1]  reserved zset         KEYS[4]  dead zset
-- KEYS[2]  inflight hash         KEYS[5]  dead:jobs hash
-- KEYS[3]  delayed zset          KEYS[6]  wake list (a retry may be due before an idle
--                                          worker's next look)
-- KEYS[7]  stats hash: "dead" and "retried" count what was written
-- KEYS[8]  recovered hash, KEYS[9] started hash: the crash marks (pop.lua), forgotten
-- KEYS[10] campaigns hash, KEYS[11] jobmeta hash, KEYS[12] dedup hash, KEYS[13]
--          dedup:exp zset: tracked jobs (ids ending "_m") that die are settled as dead
--          (_tracked.lua)
-- KEYS[14] pending hash: a retried job waits in the delayed set again (id -> entry)
-- KEYS[15] done: prefix of the per-job channels; a dead-lettered job is announced on
--          "<done>:<id>" with "d" (result waiters wake)
-- KEYS[16] gwait zset, KEYS[17] gstate hash: grouped jobs give back their group's
--          running slot; a dead one also leaves the quota count (_groups.lua gsettle)
-- KEYS[18] bundles zset (_bundles.lua)
-- KEYS[19] evconf hash, KEYS[20] events stream: when events are on, "retried" (with the
--          error) or "dead" (with the reason and error of the dead record) per job
--          (_events.lua)
-- ARGV[1]  R, the number of retries that follow
-- ARGV[2..2R+1]        pairs: lease "<id>:<attempt>" or "<bundle><position>"
--                      (_bundles.lua), retry delay in ms, optionally followed by a newline
--                      and the error (for the event)
-- ARGV[2R+2..]         pairs: lease, dead record (msgpack, built by the worker)
-- Returns  the positions (1-based, counting pairs) of stale leases, for which nothing
--          was written; when campaigns became due, a 0 follows, then their ids.
local reserved = KEYS[1]
local inflight = KEYS[2]
local delayed = KEYS[3]
local dead = KEYS[4]
local dead_jobs = KEYS[5]
local wake = KEYS[6]
local stats = KEYS[7]
local recovered = KEYS[8]
local started = KEYS[9]
local campaigns = KEYS[10]
local jobmeta = KEYS[11]
local dedup = KEYS[12]
local dedup_exp = KEYS[13]
local pending = KEYS[14]
local done = KEYS[15]
local gwait = KEYS[16]
local gstate = KEYS[17]
local bundles = KEYS[18]
local evconf = KEYS[19]
local events = KEYS[20]

-- The str value of key `key` in a dead record (a msgpack map, codec.encode_dead_record;
-- cmsgpack cannot read its bin field), '' when absent: for the "dead" event.
local function record_str(v, key)
  local _, at = string.find(v, string.char(160 + #key) .. key, 1, true)
  local b = at and string.byte(v, at + 1)
  if not b then return '' end
  if b >= 160 and b <= 191 then return string.sub(v, at + 2, at + 1 + b - 160) end
  if b == 217 then return string.sub(v, at + 3, at + 2 + string.byte(v, at + 2)) end
  if b == 218 then
    local h, l = string.byte(v, at + 2, at + 3)
    return string.sub(v, at + 4, at + 3 + h * 256 + l)
  end
  return ''
end

local now = now_ms()
local ev = ev_open(evconf)
local r = tonumber(ARGV[1])
local stale, finished = {}, {}
local back, gone = {}, {}  -- ids retried, ids dead
local retried, buried = 0, 0
local died = {}  -- tracked jobs that die
local i = 2
local cache = {}  -- bundles met (_bundles.lua)
while i < #ARGV do
  local m, v = ARGV[i], ARGV[i + 1]
  local id, e
  local single = string.byte(m, 1) ~= 58  -- ":": a bundle's job
  if single then
    id = member_id(m)
    e = id and redis.call('ZSCORE', reserved, m) and redis.call('HGET', inflight, id)
    -- the lease goes first: ZREM is never refused on a full Redis, and once the script
    -- has written Redis lets the rest through, so a full Redis cannot block retries and
    -- dead letters (the script is atomic: nothing is ever seen half done); a bundle's
    -- mask goes first the same way (bundle_state)
    if e then redis.call('ZREM', reserved, m) end
  else
    local b, p = bundle_pos(m)
    id, e = bundle_job(bundle_state(inflight, cache, b), p)
  end
  if e then
    if i <= 2 * r then
      local d, err = string.match(v, '^(%-?%d+)\n?(.*)$')
      redis.call('ZADD', delayed, now + tonumber(d or v), e)
      if ev then
        ev_entry(events, ev, now, 'retried', e, 0, err, jobmeta, id)
      end
      redis.call('HSET', pending, id, e)
      retried = retried + 1
      back[#back + 1] = id
    else
      redis.call('HSET', dead_jobs, id, v)
      redis.call('ZADD', dead, now, id)
      redis.call('PUBLISH', done .. ':' .. id, 'd')
      buried = buried + 1
      gone[#gone + 1] = id
      if tracked(id) then died[#died + 1] = id end
      if ev then
        local why = record_str(v, 'reason')
        local msg = record_str(v, 'error_message')
        local ty = record_str(v, 'error_type')
        if ty ~= '' then msg = ty .. ': ' .. msg end
        if msg ~= '' then why = why .. ': ' .. string.sub(msg, 1, 500) end
        ev_entry(events, ev, now, 'dead', e, 0, why, jobmeta, id)
      end
    end
    if single then redis.call('HDEL', inflight, id) end
    finished[#finished + 1] = id
  else
    stale[#stale + 1] = i / 2
  end
  i = i + 2
end
if #cache > 0 then bundle_done(bundles, inflight, stats, cache) end
if retried + buried > 0 then
  redis.call('HINCRBY', stats, 'retried', retried)
  redis.call('HINCRBY', stats, 'dead', buried)
end
if #finished > 0 then unpin(inflight) end
forget_marks(recovered, started, finished)
gsettle(gstate, gwait, wake, back, false)
gsettle(gstate, gwait, wake, gone, true)
if retried > 0 then leave_wake_token(wake) end
if #died > 0 then
  local due = {}
  settle_tracked(campaigns, jobmeta, dedup, dedup_exp, died, 'd', now, due)
  if #due > 0 then
    stale[#stale + 1] = 0
    for _, cid in ipairs(due) do stale[#stale + 1] = cid end
  end
end
ev_close(evconf, events, ev, now)
return stale
