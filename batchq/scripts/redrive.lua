-- redrive.lua: move dead-lettered jobs back to the tail of their ready list.
--
-- KEYS[1]  dead zset             KEYS[3]  wake list
-- KEYS[2]  dead:jobs hash        KEYS[4..13]  ready lists, priority 9 down to 0
-- KEYS[14] stats hash (a redriven job counts as enqueued again)
-- ARGV     pairs: id, encoded job with its attempt reset (built by the caller from the
--          dead record's raw bytes)
-- Returns  how many moved; an id no longer in the dead store is skipped, so two
--          concurrent redrives cannot run a job twice.
local n = 0
for i = 1, #ARGV - 1, 2 do
  local id, e = ARGV[i], ARGV[i + 1]
  if redis.call('HEXISTS', KEYS[2], id) == 1 then
    local p = tonumber(string.sub(e, 1, 1)) or 0
    redis.call('RPUSH', KEYS[4 + 9 - p], e)
    redis.call('HDEL', KEYS[2], id)
    redis.call('ZREM', KEYS[1], id)
    n = n + 1
  end
end
if n > 0 then
  redis.call('HINCRBY', KEYS[14], 'enqueued', n)
  wake(KEYS[3])
end
return n
