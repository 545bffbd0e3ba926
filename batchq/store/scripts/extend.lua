-- extend.lua: push the deadline of leases a worker still holds to now + ARGV[1] ms.
--
-- KEYS[1]  reserved zset, KEYS[2] bundles zset (_bundles.lua)
-- ARGV[1]  lease in ms
-- ARGV[2..] leases "<id>:<attempt>" or "<bundle><position>" (at most 1000 per call)
-- Returns  the positions (1-based, among the leases) of leases that were lost: already
--          expired and reaped; those are not re-created.
local reserved = KEYS[1]
local bundles = KEYS[2]

local deadline = now_ms() + tonumber(ARGV[1])
-- the leases of each zset: a bundle's jobs (_bundles.lua) extend their bundle,
-- one member for all of them
local singles, bunch = {}, {}
local at, seen = {}, {}
for i = 2, #ARGV do
  local m = ARGV[i]
  local list = singles
  if string.byte(m, 1) == 58 then
    m = string.sub(m, 1, -3)
    list = bunch
  end
  if not seen[m] then
    list[#list + 1] = m
    seen[m] = true
  end
  at[i - 1] = m
end
local alive = {}
-- push the deadline of the members of `key` still there (`scores`: their ZMSCORE)
local function extend_in(key, members, scores)
  local args, live = {}, {}
  for i, m in ipairs(members) do
    if scores[i] then
      args[#args + 1] = deadline
      args[#args + 1] = m
      live[#live + 1] = m
      alive[m] = true
    end
  end
  if #args > 0 then
    -- ZREM first: it is not refused on a full Redis and it makes the script "dirty",
    -- after which Redis lets the ZADD through (a script is never stopped halfway).
    -- Both run in one atomic script, so no lease is ever missing in between.
    redis.call('ZREM', key, unpack(live))
    redis.call('ZADD', key, unpack(args))
  end
end
if #singles > 0 then
  extend_in(reserved, singles, redis.call('ZMSCORE', reserved, unpack(singles)))
end
if #bunch > 0 then
  extend_in(bundles, bunch, redis.call('ZMSCORE', bundles, unpack(bunch)))
end
local lost = {}
for i, m in ipairs(at) do
  if not alive[m] then lost[#lost + 1] = i end
end
return lost
