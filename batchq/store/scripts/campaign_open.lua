-- campaign_open.lua: create a campaign's record unless it exists (get-or-create).
--
-- KEYS[1]  the campaign's record hash (its own hash tag)
-- ARGV[1]  on_complete task name ("" for none)   ARGV[3]  its priority
-- ARGV[2]  its queue                             ARGV[4]  its max attempts
-- ARGV[5]  campaign ttl ms (kept in the record; applied once it is finished)
-- ARGV[6]  its jobs' deadline (Unix ms, "expires_ms"; campaign_join hands it to each
--          queue it joins), "" for none
-- Returns  1 when created, 0 when it existed (its settings are left as they were).
local record = KEYS[1]

if redis.call('HSETNX', record, 'created_ms', now_ms()) == 0 then return 0 end
redis.call('HSET', record, 'on_complete', ARGV[1], 'oc_queue', ARGV[2],
  'oc_priority', ARGV[3], 'oc_max_attempts', ARGV[4], 'ttl_ms', ARGV[5])
if (ARGV[6] or '') ~= '' then redis.call('HSET', record, 'expires_ms', ARGV[6]) end
return 1
