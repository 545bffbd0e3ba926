-- extend.lua: push the deadline of leases a worker still holds to now + ARGV[1] ms.
--
-- KEYS[1]  reserved zset
-- ARGV[1]  lease in ms
-- ARGV[2..] leases "<id>:<attempt>" or "<bundle><position>" (at most 1000 per call)
-- Returns  the positions (1-based, among the leases) of leases that were lost: already
--          expired and reaped; those are not re-created.
local reserved = KEYS[1]

local deadline = now_ms() + tonumber(ARGV[1])
-- a bundle's jobs (_lib.lua "Bundles") extend their bundle: one member for all of them
local members, at, seen = {}, {}, {}
for i = 2, #ARGV do
  local m = ARGV[i]
  if string.byte(m, 1) == 58 then m = string.sub(m, 1, -3) end
  if not seen[m] then
    members[#members + 1] = m
    seen[m] = #members
  end
  at[i - 1] = seen[m]
end
local scores = redis.call('ZMSCORE', reserved, unpack(members))
local args, live, lost = {}, {}, {}
for i, m in ipairs(members) do
  if scores[i] then
    args[#args + 1] = deadline
    args[#args + 1] = m
    live[#live + 1] = m
  end
end
for i, x in ipairs(at) do
  if not scores[x] then lost[#lost + 1] = i end
end
if #args > 0 then
  -- ZREM first: it is not refused on a full Redis and it makes the script "dirty", after
  -- which Redis lets the ZADD through (a script is never stopped halfway). Both run in
  -- one atomic script, so no lease is ever missing in between.
  redis.call('ZREM', reserved, unpack(live))
  redis.call('ZADD', reserved, unpack(args))
end
return lost
