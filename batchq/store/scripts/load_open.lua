-- load_open.lua: start a load-test run (batchq bench load) or join one.
--
-- KEYS[1]  meta hash      the run's description and status
-- ARGV[1]  mode: "new" (create the run; refused if it exists) or "join" (count one
--          more producer; refused if the run does not exist)
-- ARGV[2]  time to live of the meta, ms
-- ARGV[3..] "new": field, value pairs of the description (the loop is bounded by #ARGV)
-- Returns  "new": 1 created, 0 the run exists already; "join": the meta as a flat
--          field, value list (producers already counted), or false when there is none
local meta = KEYS[1]
local mode = ARGV[1]
local ttl = tonumber(ARGV[2])
if mode == 'new' then
  if redis.call('EXISTS', meta) == 1 then return 0 end
  for i = 3, #ARGV - 1, 2 do
    redis.call('HSET', meta, ARGV[i], ARGV[i + 1])
  end
  redis.call('HSET', meta, 'status', 'running', 'producers', 0, 'created_ms', now_ms())
  redis.call('PEXPIRE', meta, ttl)
  return 1
end
if redis.call('EXISTS', meta) == 0 then return false end
redis.call('HINCRBY', meta, 'producers', 1)
return redis.call('HGETALL', meta)
