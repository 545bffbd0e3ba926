-- ack.lua: finish jobs whose handlers succeeded.
--
-- KEYS[1]  reserved zset
-- KEYS[2]  inflight hash
-- KEYS[3]  stats hash: "succeeded" counts the acks applied, exactly once each
-- KEYS[4]  recovered hash, KEYS[5] started hash: the crash marks (pop.lua), forgotten
-- ARGV     leases "<id>:<attempt>" (at most 1000 per call)
-- Returns  the positions (1-based) of stale leases: ones no longer reserved (the lease
--          expired and the job was handed out again or dead-lettered). A stale ack
--          deletes nothing.
local reserved = KEYS[1]
local inflight = KEYS[2]
local stats = KEYS[3]
local recovered = KEYS[4]
local started = KEYS[5]

local scores = redis.call('ZMSCORE', reserved, unpack(ARGV))
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
  redis.call('ZREM', reserved, unpack(live))
  redis.call('HDEL', inflight, unpack(ids))
  redis.call('HINCRBY', stats, 'succeeded', #live)
  forget_marks(recovered, started, ids)
end
return stale
