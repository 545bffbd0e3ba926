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
local tokenKey = KEYS[1]
local fenceKey = KEYS[2]
local now = now_ms()
local current = redis.call('GET', tokenKey)
if current == ARGV[1] then
  return {tonumber(redis.call('GET', fenceKey) or '0'), now, redis.call('PTTL', tokenKey)}
end
if current then
  return {0, now, redis.call('PTTL', tokenKey)}
end
-- the token first: if a full Redis refuses it, nothing was written and nobody holds it
redis.call('SET', tokenKey, ARGV[1], 'PX', tonumber(ARGV[2]))
local fence = redis.call('INCR', fenceKey)
return {fence, now, tonumber(ARGV[2])}
