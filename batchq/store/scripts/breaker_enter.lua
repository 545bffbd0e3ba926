-- breaker_enter.lua: a call is about to reach the provider behind a circuit breaker
-- (batchq/flow/breaker.py). Closed: go. Open: refused until its open time ends (server
-- clock). Then the breaker is half-open: at most ARGV[1] calls at once are let through
-- as probes (each holds a token in the probes zset, scored by when it lapses, so a
-- probe whose process died frees its place); the others are refused until a probe
-- ends.
--
-- KEYS[1]  state hash: "state" (closed | open | half_open; none: closed), "until" (ms,
--          the end of the open time), "ok" (probes that succeeded), "trips", "opened"
-- KEYS[2]  probes zset: token -> the time its probe lapses (ms)
-- ARGV[1]  half_open_jobs: probes at once, and successes that close it
-- ARGV[2]  a probe's lapse in ms
-- ARGV[3]  this call's token (random: a probe is known by it)
-- Returns  {0} closed: go; {1, ms left open} refused; {2} go as a probe;
--          {3, ms until a probe place may free} half-open, every probe place taken
local state = KEYS[1]
local probes = KEYS[2]

local st = redis.call('HGET', state, 'state')
if not st or st == 'closed' then return {0} end
local now = now_ms()
if st == 'open' then
  local left = tonumber(redis.call('HGET', state, 'until') or '0') - now
  if left > 0 then return {1, left} end
  redis.call('HSET', state, 'state', 'half_open', 'ok', 0)
  redis.call('DEL', probes)
end
redis.call('ZREMRANGEBYSCORE', probes, '-inf', now)
if redis.call('ZCARD', probes) < tonumber(ARGV[1]) then
  redis.call('ZADD', probes, now + tonumber(ARGV[2]), ARGV[3])
  return {2}
end
local first = redis.call('ZRANGE', probes, 0, 0, 'WITHSCORES')
return {3, math.max(1, tonumber(first[2]) - now)}
