-- release.lua: give back reserved jobs that did not run (or were interrupted by a
-- shutdown): they return to the head of their ready list at once, their attempt refunded.
--
-- KEYS[1]  reserved zset         KEYS[3]  wake list
-- KEYS[2]  inflight hash         KEYS[4..13]  ready lists, priority 9 down to 0
-- KEYS[14] started hash: a given-back job did not crash its worker, its mark goes
--          (its "recovered" mark stays: it still runs alone next time)
-- KEYS[15] pending hash: a given-back job is ready again (job_status, cancel.lua)
-- ARGV     leases "<id>:<attempt>" in the order the jobs were popped
-- Returns  how many were given back (stale leases are skipped).
local reserved = KEYS[1]
local inflight = KEYS[2]
local wake = KEYS[3]
local READY9 = 4  -- KEYS[READY9 + 9 - p] is the ready list of priority p
local started = KEYS[14]
local pending = KEYS[15]

local function ready_key(p)
  return KEYS[READY9 + 9 - p]
end

local marks = redis.call('HLEN', started) > 0
local n = 0
for i = #ARGV, 1, -1 do
  local m = ARGV[i]
  local id = member_id(m)
  local e = id and redis.call('ZSCORE', reserved, m) and redis.call('HGET', inflight, id)
  if e then
    local p, a, mx, _, hl = parse(e)
    if p then
      redis.call('LPUSH', ready_key(p), with_attempt(e, p, math.max(a - 1, 0), mx, id, hl))
      redis.call('ZREM', reserved, m)
      redis.call('HDEL', inflight, id)
      if marks then redis.call('HDEL', started, id) end
      redis.call('HSET', pending, id, 'r')
      n = n + 1
    end
  end
end
if n > 0 then leave_wake_token(wake) end
return n
