-- enqueue_tracked.lua: write tracked jobs (campaign members, jobs with a dedup key):
-- like enqueue.lua / schedule.lua, plus their jobmeta entries, the campaign's counters
-- on this queue and the dedup index. Plain jobs never come here.
--
-- KEYS[1]  ready list of the jobs' priority      KEYS[6]  campaigns hash
-- KEYS[2]  delayed zset                          KEYS[7]  jobmeta hash
-- KEYS[3]  wake list                             KEYS[8]  dedup hash: key -> job id
-- KEYS[4]  inflight hash                         KEYS[9]  dedup:exp zset: key -> lapse ms
-- KEYS[5]  stats hash (field "enqueued")
-- ARGV[1]  "1" when retrying a call whose reply was lost: a job whose jobmeta entry
--          exists (written by the lost call) is not written again
-- ARGV[2]  "ready", or "rel" / "abs" (delayed: ARGV[3] is a delay from the server's now,
--          or a Unix time, in ms)
-- ARGV[3]  the delay or the due time (ignored for "ready")
-- ARGV[4]  campaign id, "" for none: the campaign must be open on this queue
-- ARGV[5]  key ttl ms: how long a dedup key stays held after its job is settled
-- ARGV[6]  at most this many lapsed dedup keys are dropped first (bounds the loop)
-- ARGV[7..] pairs: encoded job (id ending "_m"), dedup key ("" for none); at most 1000
-- Returns  {0, written, position, id, position, id, ...}: the 1-based positions of jobs
--          not written because their key is held, and the id holding it; or {1} when
--          the campaign is not open on this queue yet (join it first), {2, flag} when
--          it is closed here (sealed, cancelled or done): nothing is written.
local ready = KEYS[1]
local delayed = KEYS[2]
local wake = KEYS[3]
local inflight = KEYS[4]
local stats = KEYS[5]
local campaigns = KEYS[6]
local jobmeta = KEYS[7]
local dedup = KEYS[8]
local dedup_exp = KEYS[9]

local check = ARGV[1] == '1'
local mode = ARGV[2]
local cid = ARGV[4]
local ttl = ARGV[5]

if cid ~= '' then
  local f = redis.call('HGET', campaigns, cid .. ':f')
  if not f then return {1} end
  if f ~= 'open' then return {2, f} end
end

local now = now_ms()
local lapsed = redis.call('ZRANGEBYSCORE', dedup_exp, '-inf', now, 'LIMIT', 0,
  tonumber(ARGV[6]))
if #lapsed > 0 then
  redis.call('HDEL', dedup, unpack(lapsed))
  redis.call('ZREM', dedup_exp, unpack(lapsed))
end

local out = {0, 0}
local entries, metas, keyargs, taken = {}, {}, {}, {}
local pos = 0
for i = 7, #ARGV - 1, 2 do
  pos = pos + 1
  local e, key = ARGV[i], ARGV[i + 1]
  local _, _, _, id = parse(e)
  if not id then return redis.error_reply('ERR malformed entry at position ' .. pos) end
  local write = not (check and redis.call('HEXISTS', jobmeta, id) == 1)
  if write and key ~= '' then
    local holder = redis.call('HGET', dedup, key)
    if holder then
      local lapse = redis.call('ZSCORE', dedup_exp, key)
      if lapse and tonumber(lapse) <= now then
        taken[#taken + 1] = key  -- lapsed: the key is free again
      else
        out[#out + 1] = pos
        out[#out + 1] = holder
        write = false
      end
    end
    if write then redis.call('HSET', dedup, key, id) end
  end
  if write then
    entries[#entries + 1] = e
    metas[#metas + 1] = id
    metas[#metas + 1] = cid .. '\n' .. ttl .. '\n' .. key
  end
end
if #taken > 0 then redis.call('ZREM', dedup_exp, unpack(taken)) end
if #entries == 0 then return out end

if mode == 'ready' then
  redis.call('RPUSH', ready, unpack(entries))
else
  local due = tonumber(ARGV[3])
  if mode == 'rel' then due = now + due end
  local z = {}
  for _, e in ipairs(entries) do
    z[#z + 1] = due
    z[#z + 1] = e
  end
  redis.call('ZADD', delayed, unpack(z))
end
redis.call('HSET', jobmeta, unpack(metas))
redis.call('HINCRBY', stats, 'enqueued', #entries)
if cid ~= '' then
  redis.call('HINCRBY', campaigns, cid .. ':t', #entries)
  redis.call('HINCRBY', campaigns, cid .. ':p', #entries)
end
leave_wake_token(wake)
out[2] = #entries
return out
