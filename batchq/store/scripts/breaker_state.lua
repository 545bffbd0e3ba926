-- breaker_state.lua: read one circuit breaker (batchq/flow/breaker.py) as it is now, by the
-- server's clock: an open breaker whose open time is over reads as half-open (the next
-- call that enters makes it so). Writes nothing.
--
-- KEYS[1]  state hash (breaker_enter.lua)   KEYS[3]  probes zset
-- KEYS[2]  failures zset
-- ARGV[1]  the window in ms: failures older than that are not counted
-- Returns  {state, ms left open, failures in the window, probes in flight, probes that
--          succeeded, trips}
local state = KEYS[1]
local failures = KEYS[2]
local probes = KEYS[3]

local now = now_ms()
local v = redis.call('HMGET', state, 'state', 'until', 'ok', 'trips')
local st = v[1] or 'closed'
local left = 0
if st == 'open' then
  left = math.max(0, tonumber(v[2] or '0') - now)
  if left == 0 then st = 'half_open' end
end
local nf = redis.call('ZCOUNT', failures, now - tonumber(ARGV[1]), '+inf')
local np = redis.call('ZCOUNT', probes, now, '+inf')
if st == 'half_open' and v[1] == 'open' then np = 0 end
return {st, left, nf, np, tonumber(v[3] or '0'), tonumber(v[4] or '0')}
