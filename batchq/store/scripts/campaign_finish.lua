-- campaign_finish.lua: the exactly-once guard of a campaign's completion. The caller saw
-- the campaign closed on every queue with nothing pending (pending only falls once a
-- queue is closed, so that stays true); the first call stores the final counts and the
-- finish time and starts the record's retention.
--
-- KEYS[1]  the campaign's record hash
-- KEYS[2]  the set of queues it touched
-- ARGV[1]  total   ARGV[2] succeeded   ARGV[3] dead   ARGV[4] cancelled
-- ARGV[5]  expired (absent: 0)
-- Returns  1 when this call finished it, 0 when it was finished already, -1 when there
--          is no such campaign, -2 when it is not closed yet.
local record = KEYS[1]
local queues = KEYS[2]

local rec = redis.call('HMGET', record, 'created_ms', 'finished_ms', 'closed', 'ttl_ms')
if not rec[1] then return -1 end
if rec[2] then return 0 end
if not rec[3] then return -2 end
redis.call('HSET', record, 'finished_ms', now_ms(), 'total', ARGV[1], 'succeeded', ARGV[2],
  'dead', ARGV[3], 'cancelled', ARGV[4], 'expired', ARGV[5] or 0)
local ttl = tonumber(rec[4] or '0') or 0
if ttl > 0 then
  redis.call('PEXPIRE', record, ttl)
  redis.call('PEXPIRE', queues, ttl)
end
return 1
