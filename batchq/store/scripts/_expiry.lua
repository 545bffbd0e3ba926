-- _expiry.lua: jobs with a deadline (options(expires_s=...) / expires_at, or their
-- campaign's expires_at). Such a job is tracked (a jobmeta entry until it is settled);
-- the queue's expires zset holds "x<id>" ("k<id>": kept in dead once expired), scored
-- by its deadline (server ms). pop.lua sweeps the due members before it pops: a job not
-- settled yet gets an expired tombstone in the cancel hash ("x" or "k", unless a cancel
-- put one there first), which the pop drops like a cancelled job's when it pops it
-- (never run, counted "expired"); a retry or a reaped job is popped again, so it is
-- dropped too. The sweep also adds "~<id>", looked at again a lease later: once the job
-- is settled (it was running at its deadline and finished), the tombstone goes. Jobs
-- without a deadline pay nothing: no member, no lookup per job.

-- The deadline of jobs written at `now` (ms) from spec "r<ms>" (after now) or
-- "a<Unix ms>", then "k" to keep them in dead once expired; nil for "" (none).
local function expiry_of(spec, now)
  local m, ms, k = string.match(spec or '', '^([ra])(%d+)(k?)$')
  if not m then return nil, false end
  ms = tonumber(ms)
  if m == 'r' then ms = now + ms end
  return ms, k == 'k'
end

-- The jobs ids[1], ids[1 + step], ... stamped with deadline `at` (keep: kept in dead).
local function expiry_stamp(expires, at, keep, ids, step)
  local z, pre = {}, keep and 'k' or 'x'
  for i = 1, #ids, step do
    z[#z + 1] = at
    z[#z + 1] = pre .. ids[i]
    if #z >= 2000 then
      redis.call('ZADD', expires, unpack(z))
      z = {}
    end
  end
  if #z > 0 then redis.call('ZADD', expires, unpack(z)) end
end

-- The sweep: at most `most` members due at `now`. A job not settled (its jobmeta entry
-- is there) gets its expired tombstone (HSETNX: a cancel's stays); one running now (its
-- in-flight entry is there, or it runs in a bundle: bundled_running) is also looked at
-- again at now + `recheck` ("~<id>"), so its tombstone goes once it is settled. True
-- when `most` members were due: the caller pops nothing this call (a job past its
-- deadline might not be tombstoned yet).
local function expiry_sweep(expires, cancel, jobmeta, inflight, now, most, recheck)
  local due = redis.call('ZRANGEBYSCORE', expires, '-inf', now, 'LIMIT', 0, most)
  if #due == 0 then return false end
  local ids = {}
  for i, m in ipairs(due) do ids[i] = string.sub(m, 2) end
  local alive = redis.call('HMGET', jobmeta, unpack(ids))
  local live, tomb, untomb = {}, {}, {}
  for i, m in ipairs(due) do
    local f = string.sub(m, 1, 1)
    if alive[i] then
      live[#live + 1] = ids[i]
      if f ~= '~' then tomb[ids[i]] = f end
    elseif f == '~' then
      untomb[#untomb + 1] = ids[i]
    end
  end
  for i = 1, #due, 1000 do
    redis.call('ZREM', expires, unpack(due, i, math.min(i + 999, #due)))
  end
  if #live > 0 then
    local running = redis.call('HMGET', inflight, unpack(live))
    local rest = {}  -- not leased on their own: running in a bundle, or waiting
    for j, id in ipairs(live) do
      if not running[j] then rest[#rest + 1] = id end
    end
    local bundled = #rest > 0 and bundled_running(inflight, rest) or {}
    local later = {}
    for j, id in ipairs(live) do
      if tomb[id] then redis.call('HSETNX', cancel, id, tomb[id]) end
      if running[j] or bundled[id] then
        later[#later + 1] = now + recheck
        later[#later + 1] = '~' .. id
      end
    end
    if #later > 0 then redis.call('ZADD', expires, unpack(later)) end
  end
  if #untomb > 0 then redis.call('HDEL', cancel, unpack(untomb)) end
  return #due >= most
end

-- pop.lua's sweep, after the upkeep and before the reserve (read_quiet saw whether the
-- expires zset exists: without it, nothing to do). When due members are left, this call pops nothing and
-- leaves a wake token: the worker pops again at once, and no job past its deadline
-- starts before its tombstone is there. The bound is ARGV[7] (the drops' budget).
local function expire_due(c)
  local inflight, jobmeta, cancel, expires = KEYS[3], KEYS[22], KEYS[26], KEYS[42]
  if not c.expiring then return end
  if expiry_sweep(expires, cancel, jobmeta, inflight, c.now,
                  math.max(100, tonumber(ARGV[7]) or 0), tonumber(ARGV[2])) then
    c.want = 0
    wake_token(c)
  end
end
