-- pop.lua: the worker's one call per fetch. Atomically:
--   1. moves up to ARGV[3] due delayed jobs to their ready lists (tail),
--   2. returns up to ARGV[3] expired reservations to their ready lists (head), or
--      dead-letters them (reason lease_expired) when their attempts are used up,
--   3. unless the queue is paused, pops up to ARGV[1] jobs, highest priority first,
--      counts the attempt, and reserves each until now + ARGV[2] ms.
--
-- KEYS[1]  delayed zset          KEYS[5]  dead:jobs hash
-- KEYS[2]  reserved zset         KEYS[6]  wake list
-- KEYS[3]  inflight hash         KEYS[7]  paused flag
-- KEYS[4]  dead zset             KEYS[8..17]  ready lists, priority 9 down to 0
-- KEYS[18] stats hash (optional): "dead" counts the leases dead-lettered here
-- ARGV[1]  how many jobs to pop (0 = maintenance only)
-- ARGV[2]  lease in ms
-- ARGV[3]  chunk: at most this many delayed and expired jobs are moved per call
--
-- Returns {now_ms, next_due_ms or -1, next_deadline_ms or -1, promoted, reaped,
--          expired (dead-lettered: lease_expired), malformed (dead-lettered:
--          decode_error), job, job, ...}; each job is the entry with its attempt counted.
local now = now_ms()
local want = tonumber(ARGV[1])
local lease = tonumber(ARGV[2])
local chunk = tonumber(ARGV[3])

local function ready_key(p)
  return KEYS[8 + 9 - p]
end

-- 1. due delayed jobs -> ready (write before delete; on a full Redis the first write may
--    be refused: then nothing moves this time, and the pop below still runs)
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, chunk)
local moved = {}
for _, e in ipairs(due) do
  local p = tonumber(string.sub(e, 1, 1)) or 0
  if not try_rpush(ready_key(p), e) then break end
  moved[#moved + 1] = e
end
if #moved > 0 then
  redis.call('ZREM', KEYS[1], unpack(moved))
end

-- 2. expired reservations -> ready head (latest first, so the earliest ends up in
--    front), or dead when out of attempts
local reaped, buried = 0, 0
local expired = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now, 'LIMIT', 0, chunk)
local gone = {}
for x = #expired, 1, -1 do
  local m = expired[x]
  local id = member_id(m)
  local e = id and redis.call('HGET', KEYS[3], id)
  local ok = true
  if e then
    local p, a, mx = parse(e)
    if p and a < mx then
      ok = try_lpush(ready_key(p), e)
      if ok then reaped = reaped + 1 end
    else
      ok = try_hset(KEYS[5], id, dead_record(id, 'lease_expired',
        'the worker running attempt ' .. tostring(a) .. ' died or lost its lease', e))
      if ok then
        redis.call('ZADD', KEYS[4], now, id)
        buried = buried + 1
      end
    end
    if ok then redis.call('HDEL', KEYS[3], id) end
  end
  if not ok then break end  -- refused (full Redis): the rest stay reserved until later
  gone[#gone + 1] = m
end
if #gone > 0 then
  redis.call('ZREM', KEYS[2], unpack(gone))
end
if KEYS[18] and buried > 0 then
  redis.call('HINCRBY', KEYS[18], 'dead', buried)
end
if #moved > 0 or reaped > 0 then
  wake(KEYS[6])
end

-- 3. pop and reserve
local out = {now, -1, -1, #moved, reaped, buried, 0}
if want > 0 and redis.call('EXISTS', KEYS[7]) == 0 then
  local deadline = now + lease
  local hargs, zargs = {}, {}
  for k = 8, 17 do
    if want <= 0 then break end
    local items = redis.call('LPOP', KEYS[k], want)
    if items then
      want = want - #items
      for _, e in ipairs(items) do
        local p, a, mx, id, hl = parse(e)
        if p then
          local r = with_attempt(e, p, a + 1, mx, id, hl)
          hargs[#hargs + 1] = id
          hargs[#hargs + 1] = r
          zargs[#zargs + 1] = deadline
          zargs[#zargs + 1] = id .. ':' .. (a + 1)
          out[#out + 1] = r
        else
          bury(KEYS[4], KEYS[5], now, 'raw-' .. string.sub(redis.sha1hex(e), 1, 20),
            'decode_error', 'malformed job header', e)
          out[7] = out[7] + 1
        end
      end
    end
  end
  if #hargs > 0 then
    redis.call('HSET', KEYS[3], unpack(hargs))
    redis.call('ZADD', KEYS[2], unpack(zargs))
  end
  if want <= 0 then
    -- a full batch: more may be waiting, let the next idle worker look
    wake(KEYS[6])
  end
end

local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
if first[2] then out[2] = tonumber(first[2]) end
first = redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')
if first[2] then out[3] = tonumber(first[2]) end
return out
