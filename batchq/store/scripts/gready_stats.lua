-- gready_stats.lua: read only. The grouped ready jobs of a queue by priority, and the
-- one first in line (for the oldest ready age), for operators (batchq/ops/stats.py): a skip
-- scan of gready (_groups.lua) that visits each group once, never each job.
-- Per group: its first and last member; when both have the same priority (the usual
-- case) one ZLEXCOUNT counts the group, else one ZLEXCOUNT and one ZRANGEBYLEX per
-- priority between them. The candidate for the oldest is the first job of each
-- (group, priority) run with the lowest position (positions count up in enqueue order
-- across every group; a job given back to the head of its group goes below them all).
--
-- KEYS[1]  gready zset
-- ARGV[1]  the most groups to visit (bounds the call; the rest is left uncounted)
-- Returns  {n of priority 9, ..., n of priority 0, groups visited, 1 when groups were
--          left unvisited (else 0), the member first in line ("" when none)}
local gready = KEYS[1]

local max_groups = tonumber(ARGV[1]) or 0
local counts = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0}  -- by digit: 9 - priority, plus 1
local best, best_pos = '', nil
local seen, more = 0, 0
local lo = '-'

local function consider(m, g)
  local pos = string.sub(m, #g + 3, #g + 15)
  if best_pos == nil or pos < best_pos then
    best, best_pos = m, pos
  end
end

while true do
  local first = redis.call('ZRANGEBYLEX', gready, lo, '+', 'LIMIT', 0, 1)[1]
  if not first then break end
  if seen >= max_groups then
    more = 1
    break
  end
  seen = seen + 1
  local g = string.sub(first, 1, string.find(first, '~', 1, true) - 1)
  local glo, ghi = grange(g)
  local last = redis.call('ZREVRANGEBYLEX', gready, ghi, glo, 'LIMIT', 0, 1)[1]
  local d1 = tonumber(string.sub(first, #g + 2, #g + 2)) or 0
  local d2 = tonumber(string.sub(last, #g + 2, #g + 2)) or d1
  consider(first, g)
  if d1 == d2 then
    counts[d1 + 1] = counts[d1 + 1] + redis.call('ZLEXCOUNT', gready, glo, ghi)
  else
    for d = d1, d2 do
      local plo = '[' .. g .. '~' .. d
      local phi = d < 9 and ('(' .. g .. '~' .. (d + 1)) or ghi
      local n = redis.call('ZLEXCOUNT', gready, plo, phi)
      if n > 0 then
        counts[d + 1] = counts[d + 1] + n
        if d > d1 then
          consider(redis.call('ZRANGEBYLEX', gready, plo, phi, 'LIMIT', 0, 1)[1], g)
        end
      end
    end
  end
  lo = '[' .. g .. '\127'
end

local out = {}
for i = 1, 10 do out[i] = counts[i] end
out[11] = seen
out[12] = more
out[13] = best
return out
