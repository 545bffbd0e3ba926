-- _entries.lua: server time and the job header (what an entry is: _lib.lua).

-- Server time in milliseconds: every deadline and due time comes from here, never
-- from a worker's clock.
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- The header's fields as text: priority, attempt, max_attempts, id; nil when malformed.
-- attempt and max_attempts have at most 12 digits (codec.HEADER_NUMBER_MAX): Lua numbers
-- are doubles written back with 14 significant digits, so a longer count would come
-- back as "1e+14", a lease name no script matches again, and the job would vanish.
local function header(e)
  local p, a, m, id = string.match(e, '^(%d):(%d+):(%d+):([^:]+):')
  if not p or #a > 12 or #m > 12 then return nil end
  return p, a, m, id
end

-- The id alone, nil when the header is malformed (header's rule): one capture, not
-- four (a bundling pop's job that its inline loop leaves to take()). That loop applies
-- the same rule by positions, as it does tracked's and seq_of's: change them together.
local function header_id(e)
  local _, hl, id = string.find(e, '^%d:%d+:%d+:([^:]+):')
  -- attempt and max_attempts have hl - #id - 5 digits together: up to 13, both are short
  if id and hl - #id > 18 and not header(e) then return nil end
  return id
end

-- Returns priority, attempt, max_attempts, id, header length; nil when malformed.
local function parse(e)
  local p, a, m, id = header(e)
  if not p then return nil end
  return tonumber(p), tonumber(a), tonumber(m), id, #p + #a + #m + #id + 4
end

-- The same entry with another attempt count.
local function with_attempt(e, p, a, m, id, hl)
  return p .. ':' .. a .. ':' .. m .. ':' .. id .. ':' .. string.sub(e, hl + 1)
end

-- An entry leased (pop.lua, enqueue.lua's hand-off) with its attempt counted: id, the
-- entry, its lease name ("<id>:<attempt>"); nil when malformed (header). Only
-- the new attempt is formatted: the priority, max_attempts and the rest of the entry
-- are copied as they are (with_attempt formats each number again: 0.4 us of a pop's
-- 3.6 per job).
-- p, a, id: the header's fields when the caller has them already.
local NEXT_ATTEMPT = {}  -- attempt -> the next one, as text: made once per call each

local function count_attempt(e, p, a, id)
  if not p then
    local _
    p, a, _, id = header(e)
    if not p then return nil end
  end
  -- (a number made text costs Lua a sprintf: most of this function's time per job)
  local na = NEXT_ATTEMPT[a]
  if not na then
    na = tostring(tonumber(a) + 1)
    NEXT_ATTEMPT[a] = na
  end
  return id, p .. ':' .. na .. string.sub(e, #a + 3), id .. ':' .. na
end
