-- extend.lua: push the deadline of leases a worker still holds to now + ARGV[1] ms.
--
-- KEYS[1]  reserved zset
-- ARGV[1]  lease in ms
-- ARGV[2..] leases "<id>:<attempt>" (at most 1000 per call)
-- Returns  the positions (1-based, among the leases) of leases that were lost: already
--          expired and reaped; those are not re-created.
local reserved = KEYS[1]

local deadline = now_ms() + tonumber(ARGV[1])
local n = #ARGV - 1
local scores = redis.call('ZMSCORE', reserved, unpack(ARGV, 2))
local args, lost = {}, {}
for i = 1, n do
  if scores[i] then
    args[#args + 1] = deadline
    args[#args + 1] = ARGV[i + 1]
  else
    lost[#lost + 1] = i
  end
end
if #args > 0 then
  -- ZREM first: it is not refused on a full Redis and it makes the script "dirty", after
  -- which Redis lets the ZADD through (a script is never stopped halfway). Both run in
  -- one atomic script, so no lease is ever missing in between.
  local live = {}
  for i = 2, #args, 2 do live[#live + 1] = args[i] end
  redis.call('ZREM', reserved, unpack(live))
  redis.call('ZADD', reserved, unpack(args))
end
return lost
