-- _events.lua: job events.

-- Job events (batchq/ops/events.py). A queue's events are on while its config hash (KEYS
-- "evconf") has "len": scripts that change a job's state then add to the queue's stream
-- (KEYS "events"); off, a script pays one HMGET (ev_open), or nothing where a check it
-- makes anyway also names the config (pop.lua, enqueue.lua). The jobs of one kind in
-- one call share one entry (a pop's 100 jobs: one XADD, not 100): its fields hold one
-- item per job, joined by "\0": k kind, j job ids, a attempts, t tasks, c campaigns
-- (or '' when none has one), e errors (or ''); a hold's entry has one item and also g
-- (the member held: a group's hex name, "~q" the queue) and u (until, ms). The jobs of
-- a bundle (pop.lua ARGV[6]) cost no work per job: their entry is b, the bundle's
-- packed entries as the script holds them (as popped: attempt not counted), and p,
-- the positions (two bytes each, "" for all) of the jobs it is about. Every event
-- has a number n, counting the queue's events (kept in the config hash with the last
-- ms, which never goes back); an entry's id is "<ms>-<n of its last item>", so a reader
-- behind the trim counts exactly what it missed from two ids.
-- (Few definitions: pop.lua is near Lua's 200 locals a function.)
local function ev_open(evconf)
  local c = redis.call('HMGET', evconf, 'len', 'age', 'n', 'ms')
  if not c[1] then return false end
  return {len = tonumber(c[1]) or 100000, age = tonumber(c[2]) or 0,
          n = tonumber(c[3]) or 0, ms = tonumber(c[4]) or 0, added = 0, kinds = {}}
end

-- One entry of one item written now (holds, campaigns: never many in a call); member:
-- a hold's (then until_ms).
local function ev_put(events, ev, now, kind, campaign, err, member, until_ms)
  if not ev then return end
  local n = ev.n + 1
  if now > ev.ms then ev.ms = now end
  ev.n = n
  ev.added = ev.added + 1
  redis.call('XADD', events, 'MAXLEN', '~', ev.len, ev.ms .. '-' .. n, 'k', kind, 'j', '',
             'a', '', 't', '', 'c', campaign or '', 'e', err or '', 'g', member or '',
             'u', until_ms or '', 'b', '', 'p', '')
end

-- One event of a job given by its entry e (or, e nil or malformed, by its id alone),
-- kept for ev_close; delta: added to the entry's attempt (1 for a bundle's raw entry,
-- whose attempt the worker counts). A tracked job's campaign is read from jobmeta (call
-- before settle_tracked deletes it). The task is the first item of the msgpack body (an
-- array whose first item is a str), '' when not. blob: the `count` jobs of a bundle
-- instead (its packed entries; pos their positions, '' for all): one entry of their own.
local function ev_entry(events, ev, now, kind, e, delta, err, jobmeta, id, blob, pos, count)
  if not ev then return end
  if blob then
    ev.kinds[#ev.kinds + 1] = {kind, blob, pos or '', count}
    return
  end
  local b = ev[kind]
  if not b then
    b = {{}, {}, {}, {}, {}, false, false}
    ev[kind] = b
    ev.kinds[#ev.kinds + 1] = kind
  end
  local task, s0, hl, a, pid = ''
  if e then s0, hl, a, pid = string.find(e, '^%d:(%d+):%d+:([^:]+):') end
  if pid then
    id = pid
    a = a + delta
    local byte = string.byte
    local a0, off = byte(e, hl + 1), hl + 2
    if a0 == 220 then off = hl + 4 elseif a0 == 221 then off = hl + 6 end
    local c = byte(e, off) or 0
    if c >= 160 and c <= 191 then
      task = string.sub(e, off + 1, off + c - 160)
    elseif c == 217 then
      task = string.sub(e, off + 2, off + 1 + (byte(e, off + 1) or 0))
    elseif c == 218 then
      local h, l = byte(e, off + 1, off + 2)
      task = string.sub(e, off + 3, off + 2 + (h or 0) * 256 + (l or 0))
    end
  else
    a = ''
  end
  local i = #b[1] + 1
  b[1][i], b[2][i], b[3][i] = id or '', a, task
  b[4][i], b[5][i] = '', err and string.gsub(err, '%z', '') or ''
  if err then b[7] = true end
  if id and tracked(id) then
    local v = redis.call('HGET', jobmeta, id)
    local cid = v and string.match(v, '^([^\n]*)\n')
    if cid and cid ~= '' then
      b[4][i] = cid
      b[6] = true
    end
  end
end

-- End of a call: the events kept by ev_entry written (one entry per kind), the counter
-- and last ms back to the config, and the entries older than the age limit trimmed
-- (MINID ~: whole nodes only, bounded by the server's default LIMIT; XADD's MAXLEN ~
-- bounds the count).
local function ev_close(evconf, events, ev, now)
  if not ev then return end
  if now > ev.ms then ev.ms = now end
  for _, kind in ipairs(ev.kinds) do
    ev.added = ev.added + 1
    if type(kind) == 'table' then
      ev.n = ev.n + kind[4]
      redis.call('XADD', events, 'MAXLEN', '~', ev.len, ev.ms .. '-' .. ev.n, 'k', kind[1],
                 'j', '', 'a', '', 't', '', 'c', '', 'e', '', 'g', '', 'u', '',
                 'b', kind[2], 'p', kind[3])
    else
      local b = ev[kind]
      local cat = table.concat
      ev.n = ev.n + #b[1]
      redis.call('XADD', events, 'MAXLEN', '~', ev.len, ev.ms .. '-' .. ev.n, 'k', kind,
                 'j', cat(b[1], '\0'), 'a', cat(b[2], '\0'), 't', cat(b[3], '\0'),
                 'c', b[6] and cat(b[4], '\0') or '', 'e', b[7] and cat(b[5], '\0') or '',
                 'g', '', 'u', '', 'b', '', 'p', '')
    end
  end
  ev.kinds = {}
  if ev.added == 0 then return end
  redis.call('HSET', evconf, 'n', ev.n, 'ms', ev.ms)
  if ev.age > 0 then redis.call('XTRIM', events, 'MINID', '~', now - ev.age) end
end
