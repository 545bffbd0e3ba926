-- load_merge.lua: add one process's share of a load-test run (batchq bench load): a
-- worker's histograms and errors, or a producer's sends, accumulated locally for about
-- a second and written here in one call. Counts add up (HINCRBY), so any number of
-- processes on any number of machines merge into one run. Nothing is written once the
-- run's meta is gone (expired): a late process cannot revive a run's keys.
--
-- KEYS[1]  sum hash       totals: "<h>:<bucket>" histogram counts, "<h>:max", "<h>:sum",
--                         "done", "errors", "e:<type>" counts, "x:<type>" an example...
-- KEYS[2]  timeline hash  "<unix second>:<figure>" per-second counts and run buckets
-- KEYS[3]  meta hash      the run's description and status (load_open.lua)
-- ARGV[1]  time to live of the run's keys, ms (renewed by every merge)
-- ARGV[2]  n: the number of operations that follow (bounds the loop)
-- ARGV[3..] n quadruples op, key, field, value: op "i" adds (HINCRBY), "m" keeps the
--          larger number, "n" sets if absent (HSETNX), "s" sets (HSET); key "1" sum,
--          "2" timeline, "3" meta
-- Returns  the run's status ("running", "aborted"), or false when the run is gone
local sum = KEYS[1]
local timeline = KEYS[2]
local meta = KEYS[3]
local ttl = tonumber(ARGV[1])
local n = tonumber(ARGV[2])
if redis.call('EXISTS', meta) == 0 then return false end

local function apply(key, op, field, value)
  if op == 'i' then
    redis.call('HINCRBY', key, field, value)
  elseif op == 'm' then
    local cur = tonumber(redis.call('HGET', key, field))
    if not cur or tonumber(value) > cur then redis.call('HSET', key, field, value) end
  elseif op == 'n' then
    redis.call('HSETNX', key, field, value)
  elseif op == 's' then
    redis.call('HSET', key, field, value)
  end
end

for i = 0, n - 1 do
  local at = 3 + i * 4
  local which = ARGV[at + 1]
  if which == '1' then
    apply(sum, ARGV[at], ARGV[at + 2], ARGV[at + 3])
  elseif which == '2' then
    apply(timeline, ARGV[at], ARGV[at + 2], ARGV[at + 3])
  elseif which == '3' then
    apply(meta, ARGV[at], ARGV[at + 2], ARGV[at + 3])
  end
end
redis.call('HINCRBY', sum, 'merges', 1)
redis.call('HSET', sum, 'last_merge_ms', now_ms())
redis.call('PEXPIRE', sum, ttl)
redis.call('PEXPIRE', timeline, ttl)
redis.call('PEXPIRE', meta, ttl)
return redis.call('HGET', meta, 'status')
