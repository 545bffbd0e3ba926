-- trim_dead.lua: the dead-letter retention of one queue, one bounded chunk per call.
-- The oldest dead jobs go first: those dead-lettered more than max age ago, and as many
-- of the oldest as the store holds beyond max count, whichever is more.
--
-- KEYS[1]  dead zset             (id -> time it was dead-lettered, ms)
-- KEYS[2]  dead:jobs hash        (id -> dead record)
-- ARGV[1]  max age in ms (0: no age limit)
-- ARGV[2]  max count (0: no count limit)
-- ARGV[3]  chunk: at most this many jobs are removed by one call (bounds the loop)
-- Returns  {removed, more}: more is 1 while jobs beyond the retention remain, so the
--          caller calls again (the next chunk is another short script run).
local dead = KEYS[1]
local dead_jobs = KEYS[2]
local max_age = tonumber(ARGV[1])
local max_count = tonumber(ARGV[2])
local chunk = tonumber(ARGV[3])
local now = now_ms()
local over = 0
if max_count > 0 then
  over = redis.call('ZCARD', dead) - max_count
end
if max_age > 0 then
  -- exclusive bound: a job exactly max age old stays
  local aged = redis.call('ZCOUNT', dead, '-inf', '(' .. string.format('%d', now - max_age))
  if aged > over then over = aged end
end
if over <= 0 then return {0, 0} end
local ids = redis.call('ZRANGE', dead, 0, math.min(over, chunk) - 1)
for i = 1, #ids do
  redis.call('HDEL', dead_jobs, ids[i])
  redis.call('ZREM', dead, ids[i])
end
local more = 0
if over > #ids then more = 1 end
return {#ids, more}
