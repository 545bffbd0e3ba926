-- ack.lua: finish jobs whose handlers succeeded.
--
-- KEYS[1]  reserved zset
-- KEYS[2]  inflight hash
-- KEYS[3]  stats hash (optional): "succeeded" counts the acks applied, exactly once each
-- ARGV     leases "<id>:<attempt>" (at most 1000 per call)
-- Returns  the positions (1-based) of stale leases: ones no longer reserved (the lease
--          expired and the job was handed out again or dead-lettered). A stale ack
--          deletes nothing.
local scores = redis.call('ZMSCORE', KEYS[1], unpack(ARGV))
local live, ids, stale = {}, {}, {}
for i, m in ipairs(ARGV) do
  if scores[i] then
    live[#live + 1] = m
    ids[#ids + 1] = member_id(m)
  else
    stale[#stale + 1] = i
  end
end
if #live > 0 then
  redis.call('ZREM', KEYS[1], unpack(live))
  redis.call('HDEL', KEYS[2], unpack(ids))
  if KEYS[3] then redis.call('HINCRBY', KEYS[3], 'succeeded', #live) end
end
return stale
