-- _pop_reply.lua: pop.lua's last phase: the worker's hand-off registration, the
-- reply's next times, the "started" events. It takes the call's context c.

-- The reply finished, in four steps (one function: a closure made per call each):
-- 1. ARGV[4] "<lease ms>|<worker>": a worker whose pop returns no job is registered in
--    idle until now + ARGV[5] ms (it is about to block on the wake list: enqueue.lua may
--    hand it a leased job); a pop that returns jobs ends its registration.
-- 2. The reply's next due time (out[2]: the earliest delayed job, rate token, wait's
--    end or hold end; -1 none).
-- 3. "started" per job returned with a lease of its own (a bundle's have their entry in
--    lease_jobs), and the call's events written.
-- 4. The reply's next lease deadline (out[3]: the earliest of reserved, this call's own
--    leases and the bundles; -1 none).
local function finish_reply(c)
  local idle, delayed, gwait, reserved = KEYS[38], KEYS[1], KEYS[35], KEYS[2]
  local events, jobmeta, evconf = KEYS[41], KEYS[22], KEYS[40]
  local out = c.out
  -- 1. the idle registration
  local me = ARGV[4] or ''
  if me ~= '' then
    if #out > c.header_n then
      redis.call('ZREM', idle, me)
    elseif c.want0 > 0 then
      redis.call('ZADD', idle, c.now + tonumber(ARGV[5]), me)
    end
  end
  -- 2. the next due time
  if c.promoted > 0 then c.first_due = redis.call('ZRANGE', delayed, 0, 0, 'WITHSCORES') end
  if c.first_due[2] then out[2] = tonumber(c.first_due[2]) end
  if c.flow >= 0 and (out[2] < 0 or c.flow < out[2]) then out[2] = c.flow end
  if not c.quiet then
    local first = redis.call('ZRANGEBYSCORE', gwait, '(' .. c.now, '(' .. BLOCKED,
      'WITHSCORES', 'LIMIT', 0, 1)
    if first[2] and (out[2] < 0 or tonumber(first[2]) < out[2]) then
      out[2] = tonumber(first[2])
    end
  end
  -- 3. the "started" events
  if c.ev then
    for i = c.header_n + 1, #out - (out[c.header_n][2] or 0) do
      ev_entry(events, c.ev, c.now, 'started', out[i], 0, nil, jobmeta)
    end
    ev_close(evconf, events, c.ev, c.now)
  end
  -- 4. the next lease deadline
  if c.gone and #c.gone > 0 then
    c.first_lease = redis.call('ZRANGE', reserved, 0, 0, 'WITHSCORES')
  end
  if c.first_lease[2] then out[3] = tonumber(c.first_lease[2]) end
  if c.added and (out[3] < 0 or c.added < out[3]) then out[3] = c.added end
  if c.bnext >= 0 and (out[3] < 0 or c.bnext < out[3]) then out[3] = c.bnext end
end
