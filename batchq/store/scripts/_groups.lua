-- _groups.lua: flow control (groups, limits, tokens, waits).

-- Groups (flow control, batchq/flow/limits.py). A grouped job's id carries its group as
-- "~<hex of the group name>" after the number (before a tracked job's "_m"), so every
-- script finds a job's group from its id or lease alone. Its ready copy is a member of
-- the gready zset, all scored 0 and read by lex range: "<g>~<9 - priority><13 hex
-- position><entry>": one group's jobs are contiguous, highest priority first, FIFO by
-- position inside a priority. Tail positions count up from GPOS0, head ones down.
local GPOS0 = 2251799813685248  -- 2^51

local function group_of(id)
  return string.match(id, '~(%x+)')
end

local function gentry(m)
  return string.sub(m, string.find(m, '~', 1, true) + 15)
end

-- Lex range bounds of group g's members in gready.
local function grange(g)
  return '[' .. g .. '~', '(' .. g .. '\127'
end

-- Add entries to their groups: items are {g, priority, entry}; head: in front of each
-- group (the last item ends up first, as with LPUSH). Returns false when a full Redis
-- refused the first write (nothing was written).
local function gpush(gready, gstate, items, head)
  local n = #items
  if n == 0 then return true end
  local c = redis.pcall('HINCRBY', gstate, 'pos', n)
  if not ok_reply(c) then return false end
  local args, fmt = {}, string.format
  local lg, lp, pre  -- the members' head "<g>~<9 - priority>", made once per group
  for i = 1, n do
    local it = items[i]
    local k = c - n + i
    if it[1] ~= lg or it[2] ~= lp then
      lg, lp = it[1], it[2]
      pre = lg .. '~' .. (9 - lp)
    end
    args[2 * i - 1] = '0'
    args[2 * i] = pre .. fmt('%013x', head and (GPOS0 - k) or (GPOS0 + k)) .. it[3]
  end
  redis.call('ZADD', gready, unpack(args))
  return true
end

-- gpush of the entries es[first..] of one group g and priority p, at its tail, without
-- a table per job (an enqueue call's rows are all of one group). false as gpush's.
local function gpush_tail(gready, gstate, g, p, es, first)
  local n = #es - first + 1
  if n <= 0 then return true end
  local c = redis.pcall('HINCRBY', gstate, 'pos', n)
  if not ok_reply(c) then return false end
  local args, fmt = {}, string.format
  local pre, base = g .. '~' .. (9 - p), GPOS0 + c - n - first + 1
  for i = first, #es do
    local j = 2 * (i - first)
    args[j + 1] = '0'
    args[j + 2] = pre .. fmt('%013x', base + i) .. es[i]
  end
  redis.call('ZADD', gready, unpack(args))
  return true
end

-- The virtual time a group (re)joins at: the front of the rotation, so a newcomer gets
-- its turn in the next round but no credit for the time it had no work.
local function gvt(groups, gstate)
  local first = redis.call('ZRANGE', groups, 0, 0, 'WITHSCORES')
  if first[2] then return tonumber(first[2]) end
  return tonumber(redis.call('HGET', gstate, 'vt') or '0')
end

-- Group g has ready jobs: it joins the rotation unless it is there or waits (gwait).
local function gwake(groups, gwait, gstate, g)
  if redis.call('ZSCORE', groups, g) or redis.call('ZSCORE', gwait, g) then return end
  redis.call('ZADD', groups, gvt(groups, gstate), g)
end

-- gwake for the groups `order` (at least one) at once: two ZMSCOREs and one ZADD.
local function gwake_all(groups, gwait, gstate, order)
  local in_rot = redis.call('ZMSCORE', groups, unpack(order))
  local waiting = redis.call('ZMSCORE', gwait, unpack(order))
  local add, vt = {}, nil
  for i, x in ipairs(order) do
    if not in_rot[i] and not waiting[i] then
      vt = vt or gvt(groups, gstate)
      add[#add + 1] = vt
      add[#add + 1] = x
    end
  end
  if #add > 0 then redis.call('ZADD', groups, unpack(add)) end
end

-- A limit "rate,burst,concurrency,max_pending,weight" (empty field: none) as a table.
local function limit_of(v)
  if not v then return nil end
  local r, b, c, m, w = string.match(v, '^([^,]*),([^,]*),([^,]*),([^,]*),([^,]*)$')
  if not r then return nil end
  return {rate = tonumber(r), burst = tonumber(b), conc = tonumber(c), max = tonumber(m),
          weight = tonumber(w) or 1}
end

-- Tokens in bucket f (gstate "<f>:t" / "<f>:ts") now; the state is written only when
-- tokens are taken (take_tokens), never on a refused take, so a throttled bucket refills.
local function burst_of(lim)
  return lim.burst or math.max(1, math.ceil(lim.rate / 10))
end

local function tokens(gstate, f, lim, now)
  local v = redis.call('HMGET', gstate, f .. ':t', f .. ':ts')
  local burst = burst_of(lim)
  local t, ts = tonumber(v[1]), tonumber(v[2])
  if not t or not ts then return burst end
  return math.min(burst, t + math.max(0, now - ts) * lim.rate / 1000)
end

local function take_tokens(gstate, f, left, now)
  redis.call('HSET', gstate, f .. ':t', left, f .. ':ts', now)
end

-- When the bucket holding `t` tokens is worth a look again (ms, server clock): when it
-- has `most` tokens (a turn's worth) or 10 ms of them, whichever is fewer, at least one.
-- Waking for every single token would make a fast limit cost one fetch per job.
local function next_token(t, lim, now, most)
  local need = math.max(1, math.min(most, burst_of(lim), lim.rate / 100))
  return now + math.max(1, math.ceil((need - t) * 1000 / lim.rate))
end

-- Add delta[g] to field "<g><suffix>" of gstate for every group g in order: one HMGET
-- and one HSET however many groups (a batch of 100 jobs may hold 100 groups).
local function gadd(gstate, order, delta, suffix)
  if #order == 0 then return end
  local f = {}
  for i, g in ipairs(order) do f[i] = g .. suffix end
  local v = redis.call('HMGET', gstate, unpack(f))
  local set = {}
  for i, g in ipairs(order) do
    set[#set + 1] = f[i]
    set[#set + 1] = math.max(0, (tonumber(v[i]) or 0) + delta[g])
  end
  redis.call('HSET', gstate, unpack(set))
end

-- Jobs of groups that left their leases: finished (they also leave the quota count
-- "<g>:n") or only given back / retried (`finished` false). The groups' running counts
-- go down (a group's fields, its hold's reason too, go once it has no unfinished job),
-- and a group that waited for a concurrency slot is due again (wake token); so is a
-- queue that waited for one ("~q:blk"). ids: job ids (only grouped ones count). A few
-- commands per call, not per job or group.
local function gsettle(gstate, gwait, wake, ids, finished)
  local per, order = {}, {}
  local match = string.match
  for _, id in ipairs(ids) do
    local g = match(id, '~(%x+)')  -- group_of, inline
    if g then
      if not per[g] then order[#order + 1] = g; per[g] = 0 end
      per[g] = per[g] + 1
    end
  end
  local woke = false
  if #order > 0 then
    local f = {}
    for i, g in ipairs(order) do
      f[2 * i - 1] = g .. ':run'
      f[2 * i] = g .. ':n'
    end
    local v = redis.call('HMGET', gstate, unpack(f))
    local set, del = {}, {}
    for i, g in ipairs(order) do
      local run = math.max(0, (tonumber(v[2 * i - 1]) or 0) - per[g])
      local n = tonumber(v[2 * i]) or 0
      if finished then n = n - per[g] end
      if n <= 0 and run == 0 then
        del[#del + 1] = f[2 * i - 1]
        del[#del + 1] = f[2 * i]
        del[#del + 1] = g .. ':why'  -- a hold's reason (hold.lua) goes with its work
      else
        set[#set + 1] = f[2 * i - 1]
        set[#set + 1] = run
        set[#set + 1] = f[2 * i]
        set[#set + 1] = math.max(n, 0)
      end
    end
    if #set > 0 then redis.call('HSET', gstate, unpack(set)) end
    if #del > 0 then redis.call('HDEL', gstate, unpack(del)) end
    if redis.call('ZCARD', gwait) > 0 then
      local sc = redis.call('ZMSCORE', gwait, unpack(order))
      for i, g in ipairs(order) do
        if sc[i] and tonumber(sc[i]) >= BLOCKED then
          redis.call('ZADD', gwait, 0, g)
          woke = true
        end
      end
    end
  end
  if #ids > 0 and redis.call('HDEL', gstate, QUEUE .. ':blk') == 1 then woke = true end
  if woke then leave_wake_token(wake) end
end
