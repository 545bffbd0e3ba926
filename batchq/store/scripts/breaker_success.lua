-- breaker_success.lua: a probe of a half-open circuit breaker succeeded
-- (batchq/flow/breaker.py): its place is freed, and once ARGV[1] probes have succeeded the
-- breaker closes (its failure window starts empty). A success in any other state
-- changes nothing.
--
-- KEYS[1]  state hash (breaker_enter.lua)   KEYS[3]  probes zset
-- KEYS[2]  failures zset
-- ARGV[1]  half_open_jobs: successes that close it
-- ARGV[2]  the probe's token
-- Returns  {0} closed (now or already); {2, successes so far} still half-open;
--          {1} open
local state = KEYS[1]
local failures = KEYS[2]
local probes = KEYS[3]

local st = redis.call('HGET', state, 'state')
if not st or st == 'closed' then return {0} end
if st ~= 'half_open' or redis.call('ZREM', probes, ARGV[2]) == 0 then
  return {st == 'half_open' and 2 or 1, 0}
end
local ok = redis.call('HINCRBY', state, 'ok', 1)
if ok < tonumber(ARGV[1]) then return {2, ok} end
redis.call('HSET', state, 'state', 'closed', 'ok', 0, 'until', 0)
redis.call('DEL', failures)
redis.call('DEL', probes)
return {0}
