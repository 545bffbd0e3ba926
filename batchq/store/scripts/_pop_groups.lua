-- _pop_groups.lua: pop.lua's flow control phases: groups whose wait is over rejoin the
-- rotation, the whole queue's hold and limits, the groups served in turn (weighted
-- round robin by virtual time, each within its rate and concurrency limits), the
-- jobs reserved in turns. Every phase takes the call's context c (pop.lua).

local QUANTUM = 10  -- jobs a group (of weight 1) may start in one turn

-- Groups whose wait is over (a token due, a hold ended, a slot freed) and groups that
-- just got ready jobs (c.woken) join the rotation.
local function wake_groups(c)
  local gwait, groups, gstate = KEYS[35], KEYS[34], KEYS[36]
  local over = c.quiet and {}
    or redis.call('ZRANGEBYSCORE', gwait, '-inf', c.now, 'LIMIT', 0, tonumber(ARGV[3]))
  if #over > 0 then
    redis.call('ZREM', gwait, unpack(over))
    for _, g in ipairs(over) do
      if g ~= QUEUE then c.woken[g] = true end
    end
  end
  for g in pairs(c.woken) do gwake(groups, gwait, gstate, g) end
end

-- The whole queue: a hold (RateLimited without a group), then its own limit
-- (concurrency: jobs running, leases of their own and the running jobs of bundles;
-- rate: its token bucket) cut c.want, and so do its send window and calendar quotas
-- (_windows.lua; the limits field "#" says any quota or window is set: c.cal, and
-- c.calc caches the lists read). Sets c.qlim, c.qtok, c.qcal and c.asked.
local function queue_limit(c)
  local gwait, limits, reserved, stats = KEYS[35], KEYS[37], KEYS[2], KEYS[18]
  local gstate = KEYS[36]
  local now = c.now
  local held = c.quiet and 0 or tonumber(redis.call('ZSCORE', gwait, QUEUE) or '0')
  if held > now then
    if c.flow < 0 or held < c.flow then c.flow = held end  -- c.flow: the earliest such time
    c.want = 0
  end
  local qv = c.want > 0 and not c.quiet and redis.call('HMGET', limits, QUEUE, '#') or {}
  local qlim = limit_of(qv[1])
  c.qlim = qlim
  if qv[2] then
    c.cal, c.calc = true, {}
    local qc = redis.call('HMGET', limits, QUEUE .. '#c', QUEUE .. '#w')
    if qc[1] or qc[2] then
      local n, at, _, q = cal_gate(limits, gstate, c.calc, QUEUE, qc[2] or nil,
                                   qc[1] or nil, c.want, now)
      if at and (c.flow < 0 or at < c.flow) then c.flow = at end
      c.want, c.qcal = n, q or false
    end
  end
  if qlim and c.want > 0 then
    if qlim.conc then
      local free = qlim.conc - redis.call('ZCARD', reserved)
        - (tonumber(redis.call('HGET', stats, 'bundled')) or 0)
      if free <= 0 then redis.call('HSET', gstate, QUEUE .. ':blk', 1) end
      c.want = math.min(c.want, free)
    end
    if qlim.rate and c.want > 0 then
      c.qtok = tokens(gstate, QUEUE, qlim, now)
      if c.qtok < 1 then
        local at = next_token(c.qtok, qlim, now, c.want)
        if c.flow < 0 or at < c.flow then c.flow = at end
      end
      c.want = math.min(c.want, math.floor(c.qtok))
    end
  end
  c.asked = math.max(c.want, 0)
end

-- The groups this call looks at (c.sel: names and virtual times, the front of the
-- rotation) and the plain lists' share (c.plain): the plain lists count as one more
-- participant. A turn is up to QUANTUM jobs per unit of weight: a call looks at twice
-- as many groups as it can serve, in case some are throttled or out of work. The plain
-- jobs of a pop without groups and without a queue concurrency limit are leased as one
-- bundle (ARGV[6], _bundles.lua; c.bundling), unless some job of the queue has crash
-- marks (a recovered job must be leased, and maybe run, alone: reserve_job).
local function pick_groups(c)
  local groups, gstate = KEYS[34], KEYS[36]
  local want = c.want
  local looked = math.min(want, 2 * math.ceil(want / QUANTUM))
  c.sel = want > 0 and not c.quiet
    and redis.call('ZRANGE', groups, 0, looked - 1, 'WITHSCORES') or {}
  c.plain = want
  c.bundling = ARGV[6] == '1' and #c.sel == 0 and not (c.qlim and c.qlim.conc)
  if #c.sel > 0 then
    c.lanes, c.lane_group = {{}}, {false}  -- what each participant gets (pop_groups)
    -- the plain lists take one participant's share, and when there is less than one
    -- job for each, their turn comes once per round like a group's (a pop counter)
    local parts = #c.sel / 2 + 1
    c.plain = math.floor(want / parts)
    if c.plain == 0 and redis.call('HINCRBY', gstate, 'pturn', 1) % parts == 0 then
      c.plain = 1
    end
  end
end

-- How many jobs group g (limit lim, weight w) may start now, at most n: n cut by its
-- concurrency slots and rate tokens; also why it cannot start more now (BLOCKED: no
-- slot; else when to look again; nil: it can) and its tokens (nil: no rate limit).
-- A new condition that takes a group out of the rotation until a time T sets why = T
-- (the group waits in gwait until T; c.flow tells the worker when to pop again).
local function group_allowance(c, g, lim, w, n)
  local gstate = KEYS[36]
  local why
  if lim and lim.conc then
    local run = tonumber(redis.call('HGET', gstate, g .. ':run') or '0')
    if run + n > lim.conc then n = lim.conc - run end
    if n <= 0 then why = BLOCKED end
  end
  local gtok
  if lim and lim.rate and n > 0 then
    gtok = tokens(gstate, g, lim, c.now)
    if gtok < 1 then why = next_token(gtok, lim, c.now, QUANTUM * w) end
    n = math.min(n, math.floor(gtok))
  end
  return n, why, gtok
end

-- Group g's first jobs, at most n, screened as they are read: dropped ones do not count
-- against n, the group reads on in their place (a read grows with the drops: few calls
-- per ARGV[7] dropped) while the call may drop more. Returns the lane (screened
-- entries), how many, and whether the group has ready jobs left.
local function group_take(c, g, n)
  local gready = KEYS[33]
  local lo, hi = grange(g)
  local drop_max = tonumber(ARGV[7]) or 0
  local lane, got, gdrop, more, ask = {}, 0, 0, true, n
  while got < n and more and (gdrop == 0 or c.ndrop < drop_max) do
    local items = redis.call('ZRANGEBYLEX', gready, lo, hi, 'LIMIT', 0, ask + 1)
    local es = {}
    for j = 1, math.min(ask, #items) do es[j] = gentry(items[j]) end
    local d0 = c.ndrop
    local live, used = screen(c, es, n - got)
    for _, x in ipairs(live) do
      got = got + 1
      lane[got] = x
    end
    gdrop = gdrop + c.ndrop - d0
    if used > 0 then
      -- the jobs read are the group's first ones: one range delete, not one each
      redis.call('ZREMRANGEBYLEX', gready, lo, '[' .. items[used])
    end
    more = #items > used
    ask = n - got + math.min(gdrop, math.max(0, drop_max - c.ndrop), 1000)
  end
  return lane, got, more
end

-- The groups of c.sel in turn, lowest virtual time first: each gets its weighted share
-- of what the call still wants (at least a turn), within its limits; a group that
-- cannot start more now leaves the rotation for gwait (group_allowance), one out of
-- ready jobs leaves it for good, the others move back by the jobs they got / weight.
local function pop_groups(c)
  local limits, gstate, groups, gwait = KEYS[37], KEYS[36], KEYS[34], KEYS[35]
  if #c.sel == 0 or c.want <= 0 then return end
  local sel = c.sel
  local names = {}
  for i = 1, #sel, 2 do names[#names + 1] = sel[i] end
  local lims = redis.call('HMGET', limits, '*', unpack(names))
  local deflim = limit_of(lims[1])
  local cx  -- quotas and windows: "*#c", "*#w", then "<g>#c", "<g>#w" per group
  if c.cal then
    local f = {'*#c', '*#w'}
    for _, g in ipairs(names) do
      f[#f + 1] = g .. '#c'
      f[#f + 1] = g .. '#w'
    end
    cx = redis.call('HMGET', limits, unpack(f))
  end
  local gl, sumw = {}, 0
  for i in ipairs(names) do
    gl[i] = limit_of(lims[i + 1]) or deflim
    sumw = sumw + (gl[i] and gl[i].weight or 1)
  end
  local budget = c.want
  local vts = {}
  local last_vt
  for i, g in ipairs(names) do
    if c.want <= 0 then break end
    local lim, w = gl[i], gl[i] and gl[i].weight or 1
    local n = math.min(c.want,
      math.max(math.ceil(QUANTUM * w), math.floor(budget * w / sumw + 0.5)))
    local why, gtok, gq, reason
    if cx then
      -- its own window, else "*"'s; the quotas of the limit it is under (own, else "*")
      local quota = lims[i + 1] and cx[2 * i + 1] or (not lims[i + 1] and cx[1])
      n, why, reason, gq = cal_gate(limits, gstate, c.calc, g, cx[2 * i + 2] or cx[2] or nil,
                                    quota or nil, n, c.now)
    end
    if not why then n, why, gtok = group_allowance(c, g, lim, w, n) end
    if n > 0 then
      local lane, got, more = group_take(c, g, n)
      c.lanes[#c.lanes + 1] = lane
      c.lane_group[#c.lanes] = g
      c.want = c.want - got
      if gtok then take_tokens(gstate, g, gtok - got, c.now) end
      if gq then quota_take(gstate, g, gq, got) end
      last_vt = tonumber(sel[2 * i]) + got / w
      if not more then
        redis.call('ZREM', groups, g)  -- no ready jobs left
      else
        vts[#vts + 1] = last_vt
        vts[#vts + 1] = g
      end
    end
    if why then
      redis.call('ZREM', groups, g)
      redis.call('ZADD', gwait, why, g)
      if why < BLOCKED and (c.flow < 0 or why < c.flow) then c.flow = why end
      if reason then redis.call('HSET', gstate, g .. ':why', reason .. '@' .. why) end
    end
  end
  if #vts > 0 then redis.call('ZADD', groups, unpack(vts)) end
  if last_vt then redis.call('HSET', gstate, 'vt', last_vt) end
end

-- Reserve in turns, so a batch alternates between the groups (and the plain lists);
-- the groups' running counts grow by their jobs, the queue's tokens are taken.
local function reserve_in_turns(c)
  local gstate = KEYS[36]
  if #c.sel > 0 then  -- (no groups: the plain jobs were reserved as they came)
    local running, run_order = {}, {}
    local turns = 0
    local lanes, lane_group = c.lanes, c.lane_group
    for _, lane in ipairs(lanes) do turns = math.max(turns, #lane) end
    for j = 1, turns do
      for i, lane in ipairs(lanes) do
        local x = lane[j]
        if x then
          reserve_job(c, x[1], x[2], x[3], x[4])
          local g = lane_group[i]
          if g then
            if not running[g] then run_order[#run_order + 1] = g; running[g] = 0 end
            running[g] = running[g] + 1
          end
        end
      end
    end
    gadd(gstate, run_order, running, ':run')
  end
  if c.qtok and c.asked > c.want then
    take_tokens(gstate, QUEUE, c.qtok - (c.asked - c.want), c.now)
  end
  if c.qcal then quota_take(gstate, QUEUE, c.qcal, c.asked - c.want) end
end
