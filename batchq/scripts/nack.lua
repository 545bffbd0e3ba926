-- nack.lua: failed jobs go back to the delayed set for a retry, or to the dead store.
--
-- KEYS[1]  reserved zset         KEYS[4]  dead zset
-- KEYS[2]  inflight hash         KEYS[5]  dead:jobs hash
-- KEYS[3]  delayed zset          KEYS[6]  wake list (a retry may be due before an idle
--                                          worker's next look)
-- KEYS[7]  stats hash (optional): "dead" and "retried" count what was written
-- ARGV[1]  R, the number of retries that follow
-- ARGV[2..2R+1]        pairs: lease "<id>:<attempt>", retry delay in ms
-- ARGV[2R+2..]         pairs: lease, dead record (msgpack, built by the worker)
-- Returns  the positions (1-based, counting pairs) of stale leases, for which nothing
--          was written.
local now = now_ms()
local r = tonumber(ARGV[1])
local stale = {}
local retried, buried = 0, 0
local i = 2
while i < #ARGV do
  local m, v = ARGV[i], ARGV[i + 1]
  local id = member_id(m)
  local e = id and redis.call('ZSCORE', KEYS[1], m) and redis.call('HGET', KEYS[2], id)
  if e then
    -- the lease goes first: ZREM is never refused on a full Redis, and once the script
    -- has written Redis lets the rest through, so a full Redis cannot block retries and
    -- dead letters (the script is atomic: nothing is ever seen half done)
    redis.call('ZREM', KEYS[1], m)
    if i <= 2 * r then
      redis.call('ZADD', KEYS[3], now + tonumber(v), e)
      retried = retried + 1
    else
      redis.call('HSET', KEYS[5], id, v)
      redis.call('ZADD', KEYS[4], now, id)
      buried = buried + 1
    end
    redis.call('HDEL', KEYS[2], id)
  else
    stale[#stale + 1] = i / 2
  end
  i = i + 2
end
if KEYS[7] and retried + buried > 0 then
  redis.call('HINCRBY', KEYS[7], 'retried', retried)
  redis.call('HINCRBY', KEYS[7], 'dead', buried)
end
if retried > 0 then wake(KEYS[6]) end
return stale
