-- lock_release.lua: compare-and-delete: drop the lock only if the caller still holds it.
--
-- KEYS[1]  the lock's token key
-- ARGV[1]  the caller's token
-- Returns  1 when the caller's token was deleted, 0 when the lock had expired or another
--          token holds it (then nothing is touched).
local token = KEYS[1]
if redis.call('GET', token) == ARGV[1] then
  redis.call('DEL', token)
  return 1
end
return 0
