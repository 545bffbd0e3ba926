-- breaker_failure.lua: a call behind a circuit breaker failed (batchq/flow/breaker.py).
-- Closed: the failure is counted in a sliding window (a zset of failure times); when
-- the window holds ARGV[1] failures the breaker opens for ARGV[3] ms ("trips"). A
-- failure while half-open (a probe's, or any call's) opens it again. While open,
-- failures of calls that started before it opened count nothing.
--
-- KEYS[1]  state hash (breaker_enter.lua)   KEYS[3]  probes zset
-- KEYS[2]  failures zset: token -> failure time (ms), within the window
-- ARGV[1]  failures that open it             ARGV[3]  open time in ms
-- ARGV[2]  the window in ms                  ARGV[4]  this failure's token (random)
-- Returns  {0, failures in the window} still closed; {1, ms left open, 1 when this
--          failure opened it}
local state = KEYS[1]
local failures = KEYS[2]
local probes = KEYS[3]

local now = now_ms()
local open_ms = tonumber(ARGV[3])
local st = redis.call('HGET', state, 'state')
if st == 'open' then
  local left = tonumber(redis.call('HGET', state, 'until') or '0') - now
  if left > 0 then return {1, left, 0} end
  st = 'half_open'  -- its open time is over: a failure now is a failed probe
end

local function trip()
  redis.call('HSET', state, 'state', 'open', 'until', now + open_ms, 'ok', 0,
    'opened', now)
  redis.call('HINCRBY', state, 'trips', 1)
  redis.call('DEL', failures)
  redis.call('DEL', probes)
  return {1, open_ms, 1}
end

if st == 'half_open' then return trip() end
redis.call('ZADD', failures, now, ARGV[4])
redis.call('ZREMRANGEBYSCORE', failures, '-inf', now - tonumber(ARGV[2]))
local n = redis.call('ZCARD', failures)
if n >= tonumber(ARGV[1]) then return trip() end
redis.call('PEXPIRE', failures, tonumber(ARGV[2]))
return {0, n}
