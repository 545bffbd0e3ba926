-- _leases.lua: the in-flight hash, lease names, crash marks.

-- The in-flight hash is kept a hash table, never a listpack: a listpack's HSET and HDEL
-- scan it (O(n) a field) and a worker holds a few hundred leases, so every pop and ack
-- paid n^2 (in a drain of no-op jobs with two pops on the wire, 2.3 us of the server's
-- 7.8 a job). Each HSET into it also writes PIN, whose value is longer than a listpack
-- value may be (hash-max-listpack-value, 64 by default), so the server makes a new
-- hash a table at once; unpin deletes PIN with the last lease (an idle queue keeps no
-- key). PIN is no job id: ids have no ':'.
local PIN = ':table'

local function lease_entries(inflight, hargs)
  redis.call('HSET', inflight, PIN, string.rep('.', 512), unpack(hargs))
end

local function unpin(inflight)
  if redis.call('HLEN', inflight) == 1 then redis.call('HDEL', inflight, PIN) end
end

-- "<id>:<attempt>" -> id
local function member_id(m)
  return string.match(m, '^(.*):%d+$')
end

-- Forget a finished job's crash marks (see pop.lua step 2): only when any job of the
-- queue has some, so the common path pays one HLEN per call, not one HDEL per job.
local function forget_marks(recovered, started, ids)
  if #ids > 0 and redis.call('HLEN', recovered) > 0 then
    redis.call('HDEL', recovered, unpack(ids))
    redis.call('HDEL', started, unpack(ids))
  end
end
