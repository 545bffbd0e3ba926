-- lock_acquire.lua: take a named lock (SET NX PX) and hand out its next fencing token.
--
-- KEYS[1]  the lock's token key (string: the holder's random token; expires with the lease)
-- KEYS[2]  the lock's fence counter (INCR on every acquisition; never expires, so fencing
--          tokens only grow)
-- ARGV[1]  the caller's random token
-- ARGV[2]  lease in ms (the key's PX, counted by the server)
-- Returns  {fence, now_ms, ttl_ms}: fence > 0 when the caller holds the lock (a retry
--          whose first reply was lost finds its own token and gets the same fence back);
--          fence = 0 when another token holds it, ttl_ms then being its remaining lease.
local token = KEYS[1]
local fence = KEYS[2]
local now = now_ms()
local current = redis.call('GET', token)
if current == ARGV[1] then
  return {tonumber(redis.call('GET', fence) or '0'), now, redis.call('PTTL', token)}
end
if current then
  return {0, now, redis.call('PTTL', token)}
end
-- the token first: if a full Redis refuses it, nothing was written and nobody holds it
redis.call('SET', token, ARGV[1], 'PX', tonumber(ARGV[2]))
local next_fence = redis.call('INCR', fence)
return {next_fence, now, tonumber(ARGV[2])}
