-- campaign_join.lua: a producer is about to write a campaign's jobs to a queue.
--
-- KEYS[1]  the campaign's record hash
-- KEYS[2]  the set of queues the campaign touched
-- ARGV[1]  the queue name
-- Returns  {status, created_ms, expires_ms}: status 1 joined (the queue is in the set),
--          0 refused (sealed or cancelled: seal() closes every queue in the set, so none
--          may be added after it), -1 no such campaign. created_ms is the campaign's
--          generation: the queue-side flag is opened for this generation only;
--          expires_ms its jobs' deadline ("" for none).
local record = KEYS[1]
local queues = KEYS[2]

local rec = redis.call('HMGET', record, 'created_ms', 'sealed', 'cancelled', 'expires_ms')
if not rec[1] then return {-1, 0, ''} end
if rec[2] or rec[3] then return {0, rec[1], rec[4] or ''} end
redis.call('SADD', queues, ARGV[1])
return {1, rec[1], rec[4] or ''}
