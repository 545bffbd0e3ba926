-- _windows.lua: calendar quotas and send windows (batchq/flow/windows.py). Lua has no time
-- zones: Python stores, in the limits hash, boundary lists "<cycle ms>|<ms>,<ms>,..."
-- (13 digits each, so a list is bisected by position): the ends of a zone's hours
-- ("@h:<tz>"), days ("@d:<tz>") and months ("@M:<tz>"), and a send window's opening
-- and closing instants in turn ("@w:<id>", an opening first). Here they are only read.
-- A minute is a UTC minute. Counts are gstate fields "<f>|<m|h|d|M>" =
-- "<period end ms>:<starts>"; a count of an ended period reads as 0.

-- The first boundary after `now` in boundary list `list` and its position (1-based);
-- past the list's end whole cycles are added (the position: of the boundary repeated).
-- nil when the list is malformed.
local function edge_after(list, now)
  local bar = string.find(list, '|', 1, true)
  local cycle = bar and tonumber(string.sub(list, 1, bar - 1))
  if not cycle or cycle <= 0 then return nil end
  local n = math.floor((#list - bar + 1) / 14)
  if n < 1 then return nil end
  local function at(i)
    local s = bar + 1 + (i - 1) * 14
    return tonumber(string.sub(list, s, s + 12))
  end
  local last = at(n)
  if not last then return nil end
  local shift = 0
  if now >= last then shift = (math.floor((now - last) / cycle) + 1) * cycle end
  local t = now - shift
  if (at(1) or 0) > t then return at(1) + shift, 1 end
  local lo, hi = 1, n  -- at(lo) <= t < at(hi)
  while hi - lo > 1 do
    local mid = math.floor((lo + hi) / 2)
    if at(mid) > t then hi = mid else lo = mid end
  end
  return at(hi) + shift, hi
end

-- A field of the limits hash, read once per call (cache: name -> value or false).
local function cal_read(limits, cache, name)
  local v = cache[name]
  if v == nil then
    v = redis.call('HGET', limits, name) or false
    cache[name] = v
  end
  return v
end

-- When send window `win` ("<list field>|<rule>", or nil: none) opens next, if it is
-- closed now; nil when it is open (or its list is missing: never held by a lost list).
local function window_opens(limits, cache, win, now)
  if not win then return nil end
  local list = cal_read(limits, cache, string.match(win, '^([^|]*)'))
  if not list then return nil end
  local e, i = edge_after(list, now)
  if e and i % 2 == 1 then return e end
  return nil
end

local CAL_CODES = 'mhdM'  -- the period codes, in order (a string: no table per call)

-- The calendar quotas of spec `c` ("<tz>|<per minute>|<per hour>|<per day>|<per
-- month>") now, for field f: {{code, max, period end, used}, ...}, how many more starts
-- they allow, and when they allow one again (the latest end of a used-up period).
local function quota_state(limits, gstate, cache, f, c, now)
  local tz, a, b, d, e = string.match(c, '^([^|]*)|([^|]*)|([^|]*)|([^|]*)|([^|]*)$')
  if not tz then return nil end
  if tz == '' then tz = 'UTC' end
  local maxes = {tonumber(a), tonumber(b), tonumber(d), tonumber(e)}
  local q, fields = {}, {}
  for i = 1, 4 do
    local code = string.sub(CAL_CODES, i, i)
    local most = maxes[i]
    if most then
      local stop
      if code == 'm' then
        stop = (math.floor(now / 60000) + 1) * 60000
      else
        local list = cal_read(limits, cache, '@' .. code .. ':' .. tz)
        stop = list and edge_after(list, now)
      end
      if stop then
        q[#q + 1] = {code, most, stop, 0}
        fields[#fields + 1] = f .. '|' .. code
      end
    end
  end
  if #q == 0 then return nil end
  local v = redis.call('HMGET', gstate, unpack(fields))
  local left, reset = math.huge, nil
  for i, w in ipairs(q) do
    local stop, n = string.match(v[i] or '', '^(%d+):(%d+)$')
    if tonumber(stop) == w[3] then w[4] = tonumber(n) end
    local l = w[2] - w[4]
    if l <= 0 then
      l = 0
      if not reset or w[3] > reset then reset = w[3] end
    end
    if l < left then left = l end
  end
  return q, left, reset
end

-- Count `got` starts of field f in the periods of quota state q.
local function quota_take(gstate, f, q, got)
  if not q or got <= 0 then return end
  local set = {}
  for _, w in ipairs(q) do
    set[#set + 1] = f .. '|' .. w[1]
    set[#set + 1] = w[3] .. ':' .. (w[4] + got)
  end
  redis.call('HSET', gstate, unpack(set))
end

-- The send window and calendar quotas of field f (a group, or the queue) in one pop:
-- how many of `n` jobs it may start; when none, when to look again and why ("window":
-- closed until it opens; "quota": used up until a period ends); and the quota state to
-- count its starts with (quota_take).
local function cal_gate(limits, gstate, cache, f, win, quota, n, now)
  local opens = window_opens(limits, cache, win, now)
  if opens then return 0, opens, 'window' end
  if not quota then return n end
  local q, left, reset = quota_state(limits, gstate, cache, f, quota, now)
  if not q then return n end
  if left <= 0 then return 0, reset, 'quota' end
  return math.min(n, left), nil, nil, q
end
