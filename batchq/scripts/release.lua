-- release.lua: give back reserved jobs that did not run (or were interrupted by a
-- shutdown): they return to the head of their ready list at once, their attempt refunded.
--
-- KEYS[1]  reserved zset         KEYS[3]  wake list
-- KEYS[2]  inflight hash         KEYS[4..13]  ready lists, priority 9 down to 0
-- ARGV     leases "<id>:<attempt>" in the order the jobs were popped
-- Returns  how many were given back (stale leases are skipped).
local n = 0
for i = #ARGV, 1, -1 do
  local m = ARGV[i]
  local id = member_id(m)
  local e = id and redis.call('ZSCORE', KEYS[1], m) and redis.call('HGET', KEYS[2], id)
  if e then
    local p, a, mx, _, hl = parse(e)
    if p then
      redis.call('LPUSH', KEYS[4 + 9 - p], with_attempt(e, p, math.max(a - 1, 0), mx, id, hl))
      redis.call('ZREM', KEYS[1], m)
      redis.call('HDEL', KEYS[2], id)
      n = n + 1
    end
  end
end
if n > 0 then wake(KEYS[3]) end
return n
