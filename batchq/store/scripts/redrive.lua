-- redrive.lua: move dead-lettered jobs back to the tail of their ready list.
--
-- KEYS[1]  dead zset             KEYS[3]  wake list
-- KEYS[2]  dead:jobs hash        KEYS[4..13]  ready lists, priority 9 down to 0
-- KEYS[14] stats hash (a redriven job counts as enqueued again)
-- KEYS[15] pending hash: a redriven job is ready again (job_status, cancel.lua)
-- KEYS[16] gready zset, KEYS[17] groups zset, KEYS[18] gwait zset, KEYS[19] gstate
--          hash: a grouped job goes back to the tail of its group and into its quota
--          count again
-- ARGV     pairs: id, encoded job with its attempt reset (built by the caller from the
--          dead record's raw bytes)
-- Returns  how many moved; an id no longer in the dead store is skipped, so two
--          concurrent redrives cannot run a job twice.
local dead = KEYS[1]
local dead_jobs = KEYS[2]
local wake = KEYS[3]
local READY9 = 4  -- KEYS[READY9 + 9 - p] is the ready list of priority p
local stats = KEYS[14]
local pending = KEYS[15]
local gready = KEYS[16]
local groups = KEYS[17]
local gwait = KEYS[18]
local gstate = KEYS[19]

local function ready_key(p)
  return KEYS[READY9 + 9 - p]
end

local n = 0
for i = 1, #ARGV - 1, 2 do
  local id, e = ARGV[i], ARGV[i + 1]
  if redis.call('HEXISTS', dead_jobs, id) == 1 then
    local p = tonumber(string.sub(e, 1, 1)) or 0
    local g = string.find(id, '~', 1, true) and group_of(id)
    if g then
      gpush(gready, gstate, {{g, p, e}}, false)
      redis.call('HINCRBY', gstate, g .. ':n', 1)
      gwake(groups, gwait, gstate, g)
    else
      redis.call('RPUSH', ready_key(p), e)
    end
    redis.call('HDEL', dead_jobs, id)
    redis.call('ZREM', dead, id)
    redis.call('HSET', pending, id, 'r')
    n = n + 1
  end
end
if n > 0 then
  redis.call('HINCRBY', stats, 'enqueued', n)
  leave_wake_token(wake)
end
return n
