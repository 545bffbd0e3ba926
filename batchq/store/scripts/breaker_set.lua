-- breaker_set.lua: an operator opens or closes a circuit breaker (batchq breaker
-- open|close, the console). Open: for ARGV[2] ms from now (server clock), then
-- half-open as after a trip (not counted as one). Close: closed now, its failure
-- window and probes emptied.
--
-- KEYS[1]  state hash (breaker_enter.lua)   KEYS[3]  probes zset
-- KEYS[2]  failures zset
-- ARGV[1]  "open" or "close"
-- ARGV[2]  open time in ms (open)
-- Returns  {state before, ms it had left open (0 when not open)}
local state = KEYS[1]
local failures = KEYS[2]
local probes = KEYS[3]

local now = now_ms()
local before = redis.call('HGET', state, 'state') or 'closed'
local left = 0
if before == 'open' then
  left = math.max(0, tonumber(redis.call('HGET', state, 'until') or '0') - now)
  if left == 0 then before = 'half_open' end
end
if ARGV[1] == 'open' then
  redis.call('HSET', state, 'state', 'open', 'until', now + tonumber(ARGV[2]), 'ok', 0,
    'opened', now)
else
  redis.call('HSET', state, 'state', 'closed', 'until', 0, 'ok', 0)
end
redis.call('DEL', failures)
redis.call('DEL', probes)
return {before, left}
