-- cancel.lua: cancel one job if it still waits (ready or delayed); O(1) + O(log n).
--
-- A ready job cannot leave its list without a scan (no LREM): its id goes into the
-- cancel hash and pop.lua drops the entry when it pops it. A delayed job leaves the
-- delayed set at once (its entry is the pending hash's value). Either way the job leaves
-- the pending hash, so a second cancel, or a pop racing this call (scripts run one at a
-- time), sees the truth: exactly one of "cancelled, never runs" and "popped, runs".
--
-- KEYS[1]  pending hash: id -> "r" (ready) or the entry (delayed), for jobs not in a
--          waiting bitmap
-- KEYS[2]  cancel hash: ids of cancelled ready jobs not popped yet
-- KEYS[3]  cancelled zset: id -> when it was cancelled (ms), the status record
-- KEYS[4]  delayed zset
-- KEYS[5]  stats hash: "cancelled" counts delayed jobs here (ready ones when dropped)
-- KEYS[6]  done: prefix of the per-job channels; announced with "c" on "<done>:<id>"
-- KEYS[7]  seq counter; KEYS[8..11] waiting bitmaps, slots 0..3: the bit of a job still
--          waiting since its enqueue (enqueue.lua), cleared here
-- KEYS[12] campaigns hash, KEYS[13] jobmeta hash, KEYS[14] dedup hash, KEYS[15]
--          dedup:exp zset: a tracked delayed job (id ending "_m") cancelled here is
--          settled as cancelled in its campaign at once (a ready one when pop drops it);
--          a campaign this makes due is completed by the workers' safety net
-- KEYS[16] gstate hash: a grouped job cancelled here leaves its group's quota count
--          "<g>:n" at once, ready or delayed (a ready one's tombstone says so: "q", and
--          pop.lua, dropping it, does not count it out again)
-- KEYS[17] evconf hash, KEYS[18] events stream: when events are on, "cancelled" (the
--          task only when the job was delayed: a ready one's entry is not read)
--          (_events.lua)
-- ARGV[1]  job id
-- ARGV[2]  how long cancelled records are kept (ms); older ones are trimmed here
-- ARGV[3]  at most this many old records are trimmed per call
-- Returns  1 when the job was waiting and is cancelled, 0 when it was not waiting
--          (running, finished, cancelled already, or unknown).
local pending = KEYS[1]
local cancel = KEYS[2]
local cancelled = KEYS[3]
local delayed = KEYS[4]
local stats = KEYS[5]
local done = KEYS[6]
local seq = KEYS[7]
local WAIT0 = 8  -- KEYS[WAIT0 + s] is the bitmap of slot s (0..3)
local campaigns = KEYS[12]
local jobmeta = KEYS[13]
local dedup = KEYS[14]
local dedup_exp = KEYS[15]
local gstate = KEYS[16]
local evconf = KEYS[17]
local events = KEYS[18]

local id = ARGV[1]
local v = redis.call('HGET', pending, id)
local slot, off = wait_pos(seq_top(seq), seq_of(id))
local bit = false
if not v and slot then
  bit = redis.call('GETBIT', KEYS[WAIT0 + slot], off) == 1
end
if not v and not bit then
  return 0
end
local now = now_ms()
local ev = ev_open(evconf)
-- (written before settle_tracked, which deletes the campaign membership)
ev_entry(events, ev, now, 'cancelled', v ~= 'r' and v or nil, 0, nil, jobmeta, id)
-- the records first (write before delete)
redis.call('ZADD', cancelled, now, id)
local g = string.find(id, '~', 1, true) and group_of(id)
-- the group's quota count, freed at once: the job will never run
local function free_quota()
  if g and redis.call('HINCRBY', gstate, g .. ':n', -1) <= 0 then
    redis.call('HDEL', gstate, g .. ':n')
  end
end
if bit then
  redis.call('HSET', cancel, id, g and 'q' or '1')
  redis.call('SETBIT', KEYS[WAIT0 + slot], off, 0)
  free_quota()
elseif v == 'r' or redis.call('ZREM', delayed, v) == 0 then
  -- ready (or an index out of step with the delayed set: let pop drop it)
  redis.call('HSET', cancel, id, g and 'q' or '1')
  free_quota()
else
  redis.call('HINCRBY', stats, 'cancelled', 1)
  redis.call('HDEL', cancel, id)  -- an expired tombstone (_expiry.lua) is no longer needed
  free_quota()
  if tracked(id) then
    settle_tracked(campaigns, jobmeta, dedup, dedup_exp, {id}, 'c', now, {})
  end
end
ev_close(evconf, events, ev, now)
if v then redis.call('HDEL', pending, id) end
local old = redis.call('ZRANGEBYSCORE', cancelled, '-inf', now - tonumber(ARGV[2]), 'LIMIT', 0,
                       tonumber(ARGV[3]))
if #old > 0 then
  redis.call('ZREM', cancelled, unpack(old))
end
redis.call('PUBLISH', done .. ':' .. id, 'c')
return 1
