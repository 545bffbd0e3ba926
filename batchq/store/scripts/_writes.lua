-- _writes.lua: writes a full Redis may refuse, the wake token, the pending index.

-- Leave one wake token for idle workers (never more than one). A full Redis may refuse
-- it (see `try_rpush`): a token is a hint, the workers' own timeouts cover its absence.
local function leave_wake_token(key)
  if redis.call('LLEN', key) == 0 then
    redis.pcall('RPUSH', key, '1')
  end
end

-- Writes that may be refused when Redis is out of memory (maxmemory, noeviction): Redis
-- refuses a "denyoom" command only while the script has not written yet, so the first
-- write of a script is the one at risk. They return false when refused; the caller then
-- leaves the job where it is (nothing is deleted before its copy is written).
local function ok_reply(r)
  return not (type(r) == 'table' and r.err)
end

local function try_rpush(key, value)
  return ok_reply(redis.pcall('RPUSH', key, value))
end

local function try_lpush(key, value)
  return ok_reply(redis.pcall('LPUSH', key, value))
end

local function try_hset(key, field, value)
  return ok_reply(redis.pcall('HSET', key, field, value))
end

-- Index jobs as waiting, by id (the pending hash: job_status and cancel.lua read it):
-- "r" for a ready job, the entry itself for a delayed one (cancel.lua ZREMs it). One
-- HSET per call; pairs is {id, value, id, value, ...}.
local function index_pending(pending, pairs)
  if #pairs > 0 then redis.call('HSET', pending, unpack(pairs)) end
end

-- Add ARGV[first..] (entries) to the delayed set, due at `due` (ms), and index them by
-- id in the pending hash (the entry: cancel.lua ZREMs it). A write refused by a full
-- Redis raises before anything is written (ZADD is the first write).
local function add_delayed(delayed, pending, due, first)
  local args, marks = {}, {}
  for i = first, #ARGV do
    args[#args + 1] = due
    args[#args + 1] = ARGV[i]
    local _, _, _, id = parse(ARGV[i])
    if id then
      marks[#marks + 1] = id
      marks[#marks + 1] = ARGV[i]
    end
  end
  redis.call('ZADD', delayed, unpack(args))
  index_pending(pending, marks)
end
