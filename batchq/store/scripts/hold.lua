-- hold.lua: an operator holds or releases a group, or the whole queue (batchq/flow/limits.py
-- "holds"). A hold is the member's gwait score (the time it ends, server clock); its
-- reason is the gstate field "<member>:why", "<why>@<end ms>" ("operator" here,
-- "RateLimited" when a handler raised it, release.lua): a reader shows it only while
-- the score is that end, so a field left from an expired hold never names a later
-- wait. A release ends the hold now: the member leaves gwait and a group rejoins the
-- rotation (the next pop makes it wait again for a slot or a token it still lacks),
-- and a wake token makes an idle worker pop at once.
--
-- KEYS[1]  groups zset (the rotation)     KEYS[3]  gstate hash ("<member>:why")
-- KEYS[2]  gwait zset (holds and waits)   KEYS[4]  wake list
-- KEYS[5]  evconf hash, KEYS[6] events stream: when events are on, a hold set writes
--          "held", a hold lifted "hold_lifted" (_events.lua)
-- ARGV[1]  member: "~q" (the whole queue) or a group's hex name
-- ARGV[2]  hold in ms; 0: release
-- ARGV[3]  why: the hold's reason, stored with its end time
-- Returns  a hold: {ms left of the hold in force, 1 when this one was set, 0 when a
--          longer one was kept}; a release: {ms the hold lifted had left, 1}, or {0, 0}
--          when there was none
local groups = KEYS[1]
local gwait = KEYS[2]
local gstate = KEYS[3]
local wake = KEYS[4]
local evconf = KEYS[5]
local events = KEYS[6]

local m = ARGV[1]
local hold = tonumber(ARGV[2]) or 0
local now = now_ms()
local cur = tonumber(redis.call('ZSCORE', gwait, m) or '0')
local held = cur > now and cur < BLOCKED  -- a wait for a slot (BLOCKED) is no hold

if hold > 0 then
  local until_ms = now + hold
  if held and cur >= until_ms then return {cur - now, 0} end
  redis.call('ZADD', gwait, until_ms, m)
  redis.call('HSET', gstate, m .. ':why', ARGV[3] .. '@' .. until_ms)
  if m ~= QUEUE then redis.call('ZREM', groups, m) end
  local ev = ev_open(evconf)
  ev_put(events, ev, now, 'held', nil, ARGV[3], m, until_ms)
  ev_close(evconf, events, ev, now)
  return {hold, 1}
end

redis.call('HDEL', gstate, m .. ':why')
if not held then return {0, 0} end
redis.call('ZREM', gwait, m)
if m ~= QUEUE then gwake(groups, gwait, gstate, m) end
leave_wake_token(wake)
local ev = ev_open(evconf)
ev_put(events, ev, now, 'hold_lifted', nil, '', m, now)
ev_close(evconf, events, ev, now)
return {cur - now, 1}
