-- start.lua: record that the handler of a recovered job is about to start (the worker
-- runs such a job alone, so if its process dies now, this job is the suspect; see the
-- crash marks in pop.lua).
--
-- KEYS[1]  reserved zset
-- KEYS[2]  started hash: id -> lease
-- ARGV     leases "<id>:<attempt>" (at most 1000 per call)
-- Returns  how many were marked (a lease no longer reserved is skipped).
local reserved = KEYS[1]
local started = KEYS[2]

local n = 0
for i = 1, #ARGV do
  local m = ARGV[i]
  local id = member_id(m)
  if id and redis.call('ZSCORE', reserved, m) then
    redis.call('HSET', started, id, m)
    n = n + 1
  end
end
return n
