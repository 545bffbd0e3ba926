-- campaign_close.lua: seal a campaign (no more jobs) or cancel it (no more jobs, and
-- the ones not started never run); the first step of both, on the campaign's slot.
-- The caller then closes every listed queue (campaign_queue.lua) and sets "closed".
--
-- KEYS[1]  the campaign's record hash
-- KEYS[2]  the set of queues the campaign touched
-- ARGV[1]  "seal" or "cancel"
-- Returns  {status, created_ms, queue, queue, ...}: status 1 done (or already so), 0 the
--          campaign finished already (a cancel then changes nothing), -1 no such
--          campaign.
local record = KEYS[1]
local queues = KEYS[2]

local rec = redis.call('HMGET', record, 'created_ms', 'finished_ms')
if not rec[1] then return {-1, 0} end
local out = {1, rec[1]}
if rec[2] then
  out[1] = 0
else
  redis.call('HSET', record, 'sealed', 1)
  if ARGV[1] == 'cancel' then redis.call('HSET', record, 'cancelled', 1) end
end
for _, q in ipairs(redis.call('SMEMBERS', queues)) do out[#out + 1] = q end
return out
