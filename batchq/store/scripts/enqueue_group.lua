-- enqueue_group.lua: write jobs of one group, or of several (enqueue_many's group_fn),
-- (flow control): ready ones into their group's place in gready, delayed ones into the
-- delayed set; all within each group's quota.
--
-- KEYS[1]  gready zset           KEYS[5]  limits hash
-- KEYS[2]  groups zset           KEYS[6]  delayed zset
-- KEYS[3]  gwait zset            KEYS[7]  wake list
-- KEYS[4]  gstate hash: "<g>:n" counts the group's unfinished jobs (the quota)
-- KEYS[8]  inflight hash (the retry check)
-- KEYS[9]  stats hash (field "enqueued" counts every job written)
-- KEYS[10] pending hash: id -> entry of each delayed job (job_status, cancel.lua)
-- KEYS[11] seq counter; KEYS[12..15] waiting bitmaps, slots 0..3: the bits of ready
--          jobs' sequence numbers are set (as in enqueue.lua)
-- KEYS[16] ready list of the jobs' priority: the rows of a several-group call that
--          have no group (pushed there, as enqueue.lua would, without its hand-off)
-- ARGV[1]  "1" when this call retries one whose reply was lost: if its first job is
--          already written (waiting, delayed or running), nothing is written again
-- ARGV[2]  "ready", "rel" (ARGV[3] is a delay in ms from the server's now) or "abs"
--          (ARGV[3] is a Unix time in ms)
-- ARGV[3]  the delay or the due time (0 for "ready")
-- ARGV[4]  the group (hex of its name, limits.group_hex); or, for a call of several
--          groups, the rows' groups as runs in row order "<g>:<count>,<g>:<count>,..."
--          (at most one run per row; "<g>" empty: rows without a group)
-- ARGV[5]  the jobs' priority
-- ARGV[6]  the ready jobs' sequence numbers as runs "first:count,..." ("" for none)
-- ARGV[7..] encoded jobs (1..1000 per call; the caller chunks)
-- Returns  the group's unfinished jobs after the write (several groups: the jobs
--          written); -1 when the retry found the jobs written; -2 when the write would
--          take the group past its max_pending (several groups: {-2, g}, g the first
--          group that would); nothing is written then.
local gready = KEYS[1]
local groups = KEYS[2]
local gwait = KEYS[3]
local gstate = KEYS[4]
local limits = KEYS[5]
local delayed = KEYS[6]
local wake = KEYS[7]
local inflight = KEYS[8]
local stats = KEYS[9]
local pending = KEYS[10]
local seq = KEYS[11]
local WAIT0 = 12  -- KEYS[WAIT0 + s] is the bitmap of slot s (0..3)
local ready = KEYS[16]

local mode, g, p = ARGV[2], ARGV[4], tonumber(ARGV[5])
local count = #ARGV - 6
local top = seq_top(seq)
if ARGV[1] == '1' then
  local _, _, _, id = parse(ARGV[7])
  local slot, off = wait_pos(top, id and seq_of(id))
  if (id and (redis.call('HEXISTS', inflight, id) == 1
              or redis.call('HEXISTS', pending, id) == 1))
      or (slot and redis.call('GETBIT', KEYS[WAIT0 + slot], off) == 1) then
    return -1
  end
end

local due
if mode ~= 'ready' then
  due = tonumber(ARGV[3])
  if mode == 'rel' then due = now_ms() + due end
end

if not string.find(g, ':', 1, true) then  -- one group
  local lim = limit_of(redis.call('HGET', limits, g))
    or limit_of(redis.call('HGET', limits, '*'))
  local n = tonumber(redis.call('HGET', gstate, g .. ':n') or '0')
  if lim and lim.max and n + count > lim.max then
    return -2
  end
  if due then
    add_delayed(delayed, pending, due, 7)
  else
    gpush_tail(gready, gstate, g, p, ARGV, 7)
    gwake(groups, gwait, gstate, g)
    mark_waiting(top, ARGV[6], WAIT0)
  end
  redis.call('HINCRBY', stats, 'enqueued', count)
  leave_wake_token(wake)
  return redis.call('HINCRBY', gstate, g .. ':n', count)
end

-- several groups: the runs, the groups in order of first row, each group's rows
local runs, order, per, rows = {}, {}, {}, 0
for rg, c in string.gmatch(g, '(%x*):(%d+)') do
  c = tonumber(c)
  runs[#runs + 1] = rg
  runs[#runs + 1] = c
  rows = rows + c
  if rg ~= '' then
    if not per[rg] then order[#order + 1] = rg; per[rg] = 0 end
    per[rg] = per[rg] + c
  end
end
if rows ~= count then
  return redis.error_reply('ERR the group runs count ' .. rows .. ' rows, not ' .. count)
end

-- the quotas first (nothing is written past one): one HMGET of the limits, one of the
-- counts of the groups under a max_pending
if #order > 0 then
  local f = {}
  for i, x in ipairs(order) do f[i] = x end
  f[#f + 1] = '*'
  local lv = redis.call('HMGET', limits, unpack(f))
  local any = limit_of(lv[#f])
  local capped, caps = {}, {}
  for i, x in ipairs(order) do
    local lim = limit_of(lv[i]) or any
    if lim and lim.max then
      capped[#capped + 1] = x
      caps[#caps + 1] = lim.max
    end
  end
  if #capped > 0 then
    local nf = {}
    for i, x in ipairs(capped) do nf[i] = x .. ':n' end
    local nv = redis.call('HMGET', gstate, unpack(nf))
    for i, x in ipairs(capped) do
      if (tonumber(nv[i]) or 0) + per[x] > caps[i] then return {-2, x} end
    end
  end
end

if due then
  add_delayed(delayed, pending, due, 7)
else
  -- every grouped row in one ZADD (positions in row order: FIFO inside each group),
  -- the rows without a group in one RPUSH
  local grouped = 0
  for _, x in ipairs(order) do grouped = grouped + per[x] end
  local zs, plain = {}, {}
  if grouped > 0 then
    -- positions (13 hex digits) as 11 digits made per 256 rows and the last two
    -- looked up: a string.format per row was a fifth of the call
    local pos = GPOS0 + redis.call('HINCRBY', gstate, 'pos', grouped) - grouped + 1
    local h = {'0', '1', '2', '3', '4', '5', '6', '7', '8', '9', 'a', 'b', 'c', 'd', 'e', 'f'}
    local lo = {}
    for a = 1, 16 do
      for b = 1, 16 do lo[16 * (a - 1) + b] = h[a] .. h[b] end
    end
    local low = pos % 256
    local hiv = (pos - low) / 256
    local fmt, last, nz = string.format, 9 - p, 0
    local hi = fmt('%011x', hiv)
    local i = 7
    for r = 1, #runs, 2 do
      local rg, c2 = runs[r], runs[r + 1]
      if rg == '' then
        for j = i, i + c2 - 1 do plain[#plain + 1] = ARGV[j] end
      else
        local pre = rg .. '~' .. last
        for j = i, i + c2 - 1 do
          zs[nz + 1] = '0'
          zs[nz + 2] = pre .. hi .. lo[low + 1] .. ARGV[j]
          nz = nz + 2
          low = low + 1
          if low == 256 then low, hiv = 0, hiv + 1; hi = fmt('%011x', hiv) end
        end
      end
      i = i + c2
    end
    redis.call('ZADD', gready, unpack(zs))
  else
    for j = 7, #ARGV do plain[#plain + 1] = ARGV[j] end
  end
  if #plain > 0 then redis.call('RPUSH', ready, unpack(plain)) end
  -- the groups not in the rotation nor waiting join it, at its front (gwake)
  if #order > 0 then gwake_all(groups, gwait, gstate, order) end
  mark_waiting(top, ARGV[6], WAIT0)
end
redis.call('HINCRBY', stats, 'enqueued', count)
leave_wake_token(wake)
gadd(gstate, order, per, ':n')
return count
