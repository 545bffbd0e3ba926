-- lock_extend.lua: compare-and-extend: reset the lease of a lock the caller still holds.
--
-- KEYS[1]  the lock's token key
-- ARGV[1]  the caller's token
-- ARGV[2]  the new lease in ms, counted from now (server clock)
-- Returns  {1, now_ms} when the lease was reset; {0, now_ms} when the lock had expired or
--          another token holds it (it is never re-created: a lost lock stays lost).
local token = KEYS[1]
local now = now_ms()
if redis.call('GET', token) == ARGV[1] then
  redis.call('PEXPIRE', token, tonumber(ARGV[2]))
  return {1, now}
end
return {0, now}
