-- _dead.lua: dead records, written inside a script.

-- Minimal msgpack writers for dead records built inside a script.
local function be(n, bytes)
  local out = {}
  for i = bytes, 1, -1 do
    out[i] = string.char(n % 256)
    n = math.floor(n / 256)
  end
  return table.concat(out)
end

local function mp_str(s)
  local n = #s
  if n < 32 then return string.char(0xa0 + n) .. s end
  if n < 256 then return '\217' .. be(n, 1) .. s end
  if n < 65536 then return '\218' .. be(n, 2) .. s end
  return '\219' .. be(n, 4) .. s
end

local function mp_bin(s)
  local n = #s
  if n < 256 then return '\196' .. be(n, 1) .. s end
  if n < 65536 then return '\197' .. be(n, 2) .. s end
  return '\198' .. be(n, 4) .. s
end

-- A dead record: msgpack {id, reason, error_message, raw}.
local function dead_record(id, reason, message, raw)
  return string.char(0x84) .. mp_str('id') .. mp_str(id) .. mp_str('reason') .. mp_str(reason)
    .. mp_str('error_message') .. mp_str(message) .. mp_str('raw') .. mp_bin(raw)
end

-- Write a dead record. Callers delete the job's other copies only after this write.
local function bury(dead, dead_jobs, now, id, reason, message, raw)
  redis.call('HSET', dead_jobs, id, dead_record(id, reason, message, raw))
  redis.call('ZADD', dead, now, id)
end
