-- _lib.lua: helpers prepended to every batchq script (not a script of its own).
--
-- An encoded job ("entry") is   <priority>:<attempt>:<max_attempts>:<id>:<msgpack body>
-- priority is one digit 0..9, attempt is how many runs have started, id has no ':'.

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
local function count_attempt(e, p, a, id)
  if not p then
    local _
    p, a, _, id = header(e)
    if not p then return nil end
  end
  local na = tostring(tonumber(a) + 1)
  return id, p .. ':' .. na .. string.sub(e, #a + 3), id .. ':' .. na
end

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

-- Bundles (pop.lua, ARGV[6]): the plain jobs of one pop leased together. One member
-- ":b<n>.<ms>" in the bundles zset (its deadline; apart from the reserved zset, so a
-- worker from before bundles, whose reaper reads only reserved, never takes one), and
-- two fields of that name in the inflight hash: the name itself holds the entries as
-- popped (their attempt NOT counted: the worker counts it, and a bundle job's counted
-- entry is count_attempt of its raw one), the name .. "~" a mask, one byte a job, "0"
-- running, "1" settled. The bundle goes with its last job. The name has no id in it
-- (ids have no ':'), and a name is never used twice (a counter and the server time),
-- so a late ack of a reaped bundle finds nothing. A bundle job's lease is the name and
-- its position (1-based) in two bytes, big-endian: read with one string.sub and one
-- string.byte (a pattern with captures cost an ack 2.4 times as much). A lease that
-- names no live bundle, or a position it does not have, is stale.
local function bundle_pos(m)
  local hi, lo = string.byte(m, -2, -1)
  return string.sub(m, 1, -3), (hi or 0) * 256 + (lo or 0)
end

-- A bundle's state for one call: {entries (packed until needed), mask bytes, jobs
-- settled}, or false when it is gone (reaped, or settled). Read once per call (cache:
-- name -> state, and the names in order). The mask field is deleted on the first read:
-- a delete is never refused on a full Redis, so the writes after it are let through
-- (as the per-job scripts' ZREM first); bundle_done writes it back, or deletes the
-- bundle with its last job.
local function bundle_state(inflight, cache, b)
  local bd = cache[b]
  if bd == nil then
    local v = redis.call('HMGET', inflight, b, b .. '~')
    bd = false
    -- (a name is ":b" and digits: not the pin, nor a mask)
    if v[1] and string.byte(b, 2) == 98 and string.byte(b, -1) ~= 126 then
      -- no mask (a script stopped by an error between its delete and write-back): all
      -- its jobs count as running, to run again rather than be lost
      local es = not v[2] and cmsgpack.unpack(v[1])
      if v[2] or type(es) == 'table' then
        redis.call('HDEL', inflight, b .. '~')
        bd = {es or v[1], {string.byte(v[2] or string.rep('0', #es), 1, -1)}, 0}
      end
    end
    cache[#cache + 1] = b
    cache[b] = bd
  end
  return bd
end

-- Settle the job at position p of bundle state bd: true when it was running.
local function bundle_settle(bd, p)
  if not bd or bd[2][p] ~= 48 then return false end
  bd[2][p] = 49
  bd[3] = bd[3] + 1
  return true
end

-- The running job at position p of bundle state bd, now settled in bd: its id, its
-- entry with the attempt counted, its raw entry; nil when it was settled already.
local function bundle_job(bd, p)
  if not bundle_settle(bd, p) then return nil end
  if type(bd[1]) == 'string' then bd[1] = cmsgpack.unpack(bd[1]) end
  local raw = bd[1][p]
  local id, e = count_attempt(raw)
  return id, e, raw
end

-- Write back what a call settled: each bundle of `cache` keeps its new mask, or goes
-- (its bundles member, both fields) with its last job; the stats field "bundled" (the
-- running jobs of live bundles) follows, so a reader counts reserved jobs as
-- ZCARD(reserved) + bundled (stats.py).
local function bundle_done(bundles, inflight, stats, cache)
  local settled = 0
  for _, b in ipairs(cache) do
    local bd = cache[b]
    if bd then
      settled = settled + bd[3]
      local mask = string.char(unpack(bd[2]))
      if string.find(mask, '0', 1, true) then
        redis.call('HSET', inflight, b .. '~', mask)
      else
        redis.call('HDEL', inflight, b)
        redis.call('ZREM', bundles, b)
      end
    end
  end
  if settled > 0 then redis.call('HINCRBY', stats, 'bundled', -settled) end
end

-- Is job `id` running (leased: its own lease, or a running job of a bundle)? Bundles
-- are few (one per pop in flight) and each is searched as one string; at most 10,000
-- fields of inflight are read (HSCAN). For status and the retry checks, never a hot path.
local function is_running(inflight, id)
  if redis.call('HEXISTS', inflight, id) == 1 then return true end
  local cursor, looked = '0', 0
  repeat
    local r = redis.call('HSCAN', inflight, cursor, 'MATCH', ':b*', 'COUNT', 100)
    cursor = r[1]
    local kv = r[2]
    for i = 1, #kv, 2 do
      -- a bundle's entries (its mask's name ends in "~"), holding the id somewhere
      if string.byte(kv[i], -1) ~= 126 and string.find(kv[i + 1], id, 1, true) then
        for pos, e in ipairs(cmsgpack.unpack(kv[i + 1])) do
          local _, _, _, jid = header(e)
          if jid == id then
            local mask = redis.call('HGET', inflight, kv[i] .. '~')
            if mask and string.byte(mask, pos) == 48 then return true end
          end
        end
      end
    end
    looked = looked + 100
  until cursor == '0' or looked >= 10000
  return false
end

-- Forget a finished job's crash marks (see pop.lua step 2): only when any job of the
-- queue has some, so the common path pays one HLEN per call, not one HDEL per job.
local function forget_marks(recovered, started, ids)
  if #ids > 0 and redis.call('HLEN', recovered) > 0 then
    redis.call('HDEL', recovered, unpack(ids))
    redis.call('HDEL', started, unpack(ids))
  end
end

-- Tracked jobs: campaign members and jobs with a dedup key. Their ids end in "_m"
-- (producer: codec.TRACKED_SUFFIX) and they have a jobmeta entry
-- "<campaign>\n<key ttl ms>\n<dedup key>" until settled. Plain jobs pay one string
-- compare here and no Redis call. (pop.lua's bundling loop checks the same two bytes
-- in the entry, inline.)
local function tracked(id)
  local a, b = string.byte(id, -2, -1)
  return a == 95 and b == 109  -- "_m", without making a string
end

-- {id, campaign, key ttl ms, key} of the ids that still have a jobmeta entry.
local function meta_of(jobmeta, ids)
  local out = {}
  if #ids == 0 then return out end
  local vals = redis.call('HMGET', jobmeta, unpack(ids))
  for i, v in ipairs(vals) do
    if v then
      local cid, ttl, key = string.match(v, '^([^\n]*)\n(%d*)\n(.*)$')
      if cid then out[#out + 1] = {ids[i], cid, tonumber(ttl) or 0, key} end
    end
  end
  return out
end

-- Settle tracked jobs for good: outcome 's' (succeeded), 'd' (dead) or 'c' (cancelled).
-- Counted by membership: only jobs whose jobmeta entry is still there count, and the
-- entry goes, so a redelivered or double-acked job counts once. A dedup key that still
-- names its job starts to lapse (now + its ttl).
-- Campaigns whose pending count on this queue reaches 0 while closed here (sealed or
-- cancelled) are appended to `due`: the caller's process then tries to complete them.
-- known (optional): id -> jobmeta entry the caller read in this call (not read again).
local function settle_tracked(campaigns, jobmeta, dedup, dedup_exp, ids, outcome, now, due,
                              known)
  if #ids == 0 then return end
  local vals
  if known then
    local rest, at = {}, {}
    vals = {}
    for i, id in ipairs(ids) do
      local v = known[id]
      if v then
        vals[i] = v
      else
        rest[#rest + 1] = id
        at[#at + 1] = i
        vals[i] = false
      end
    end
    if #rest > 0 then
      local got = redis.call('HMGET', jobmeta, unpack(rest))
      for j, i in ipairs(at) do vals[i] = got[j] end
    end
  else
    vals = redis.call('HMGET', jobmeta, unpack(ids))
  end
  local gone, per, order, keys, kids, kttl = {}, {}, {}, {}, {}, {}
  local ng, nk = 0, 0
  -- the jobs of one campaign without dedup keys share one entry: a job whose entry is
  -- the previous one's (one pointer compare: Lua strings are interned) is not parsed
  local last, last_cid = nil, nil
  for i = 1, #ids do
    local v = vals[i]
    if v and v == last then
      ng = ng + 1
      gone[ng] = ids[i]
      if last_cid then per[last_cid] = per[last_cid] + 1 end
    else
      local nl = v and string.find(v, '\n', 1, true)
      if nl then
        ng = ng + 1
        gone[ng] = ids[i]
        last_cid = nil
        if nl > 1 then
          local cid = string.sub(v, 1, nl - 1)
          if not per[cid] then order[#order + 1] = cid; per[cid] = 0 end
          per[cid] = per[cid] + 1
          last_cid = cid
        end
        local nl2 = string.find(v, '\n', nl + 1, true)
        if nl2 and nl2 < #v then  -- a dedup key follows the second newline
          nk = nk + 1
          keys[nk] = string.sub(v, nl2 + 1)
          kids[nk] = ids[i]
          kttl[nk] = tonumber(string.sub(v, nl + 1, nl2 - 1)) or 0
          last = nil  -- an entry with a key is one job's own
        else
          last = v
        end
      end
    end
  end
  for _, cid in ipairs(order) do
    local n = per[cid]
    redis.call('HINCRBY', campaigns, cid .. ':' .. outcome, n)
    if redis.call('HINCRBY', campaigns, cid .. ':p', -n) <= 0 then
      local f = redis.call('HGET', campaigns, cid .. ':f')
      if f == 'sealed' or f == 'cancelled' then due[#due + 1] = cid end
    end
  end
  if #keys > 0 then
    local cur = redis.call('HMGET', dedup, unpack(keys))
    local z = {}
    for i, k in ipairs(keys) do
      if cur[i] == kids[i] then
        z[#z + 1] = now + kttl[i]
        z[#z + 1] = k
      end
    end
    if #z > 0 then redis.call('ZADD', dedup_exp, unpack(z)) end
  end
  if ng > 0 then redis.call('HDEL', jobmeta, unpack(gone)) end
end

-- Ready-job bitmaps (keys.py T:waiting0..3): the sequence number in an id made by
-- enqueue ("...-<hex>", then "~<group>" and "_m" when grouped or tracked), or nil for
-- any other id. (pop.lua's bundling loop reads a plain job's number from the entry,
-- inline, by the same rule.)
local WAIT_GEN = 8388608  -- 2^23 bits per generation (keys.WAIT_GEN_BITS)
local function seq_of(id)
  if string.byte(id, 18) ~= 45 then return nil end  -- "-"
  local h = string.match(id, '^%x+', 19)  -- a group ("~...") or "_m" may follow
  return h and tonumber(h, 16)
end

-- The next free sequence number (T:seq), read once per call.
local function seq_top(seqkey)
  return tonumber(redis.call('GET', seqkey) or '0')
end

-- Slot (0..3) and bit offset of sequence number s, or nil when s was never handed out
-- or its generation's bitmap has been reused (4 generations back).
local function wait_pos(top, s)
  if not s or s < 0 or s >= top then return nil end
  local g = math.floor(s / WAIT_GEN)
  if math.floor((top - 1) / WAIT_GEN) - g > 3 then return nil end
  return g % 4, s - g * WAIT_GEN
end

-- Set (bit 1) or clear (bit 0) the bits of `count` consecutive offsets from `off` in
-- one bitmap: one BITFIELD (the partial first byte, whole bytes 32 bits a field, the
-- partial last byte: a pop's run of 100 is one call), or for a run of more than 32
-- whole bytes, a SETRANGE for those between the two partial bytes' BITFIELDs.
local function set_bits(key, off, count, bit)
  local ops = {}
  local function field(bits)
    ops[#ops + 1] = 'SET'
    ops[#ops + 1] = 'u' .. bits
    ops[#ops + 1] = off
    ops[#ops + 1] = bit * (2 ^ bits - 1)  -- at most 2^32 - 1: ten digits, exact
    off = off + bits
    count = count - bits
  end
  local head = (8 - off % 8) % 8
  if head > count then head = count end
  if head > 0 then field(head) end
  local whole = math.floor(count / 8)
  if whole > 32 then
    if #ops > 0 then redis.call('BITFIELD', key, unpack(ops)) end
    ops = {}
    redis.call('SETRANGE', key, off / 8, string.rep(bit == 1 and '\255' or '\0', whole))
    off = off + whole * 8
    count = count - whole * 8
  else
    while count >= 32 do field(32) end
    if count >= 8 then field(math.floor(count / 8) * 8) end
  end
  if count > 0 then field(count) end
  if #ops > 0 then redis.call('BITFIELD', key, unpack(ops)) end
end

-- Set (bit 1) or clear (bit 0) the waiting bits of `left` consecutive sequence numbers
-- from `s` in the bitmaps KEYS[wait0 + slot] (set_bits: one command, or three for a
-- long run, per bitmap); top: the next free number.
local function set_run(top, wait0, s, left, bit)
  if s < 0 then return end
  if s + left > top then left = top - s end  -- never handed out: no bit
  while left > 0 do
    local slot, off = wait_pos(top, s)
    local m = math.min(left, WAIT_GEN - s % WAIT_GEN)
    if slot then set_bits(KEYS[wait0 + slot], off, m, bit) end
    s = s + m
    left = left - m
  end
end

-- The waiting bits of runs given as text ("first:count,first:count", "" for none), but
-- for the numbers in `skip` (a list, ascending; nil for none): jobs enqueue.lua handed
-- off are leased at once and never wait (their bits are neither set nor cleared).
local function mark_waiting(top, runs, wait0, skip)
  skip = skip or {}
  for first, count in string.gmatch(runs, '(%d+):(%d+)') do
    local s = tonumber(first)
    local last = s + tonumber(count) - 1
    for _, x in ipairs(skip) do
      if x >= s and x <= last then
        if x > s then set_run(top, wait0, s, x - s, 1) end
        s = x + 1
      end
    end
    if s <= last then set_run(top, wait0, s, last - s + 1, 1) end
  end
end

-- Set (bit 1) or clear (bit 0) the waiting bits of the sequence numbers in `seqs` (a
-- list; runs of consecutive numbers, as a chunk's ids have and a FIFO pop takes, cost
-- one command each (set_bits), instead of one SETBIT per job); top: the next free number.
local function set_waiting(top, wait0, seqs, bit)
  local n = #seqs
  local i = 1
  while i <= n do
    local j = i
    while j < n and seqs[j + 1] == seqs[j] + 1 do j = j + 1 end
    set_run(top, wait0, seqs[i], j - i + 1, bit)
    i = j + 1
  end
end

-- Groups (flow control, batchq/limits.py). A grouped job's id carries its group as
-- "~<hex of the group name>" after the number (before a tracked job's "_m"), so every
-- script finds a job's group from its id or lease alone. Its ready copy is a member of
-- the gready zset, all scored 0 and read by lex range: "<g>~<9 - priority><13 hex
-- position><entry>": one group's jobs are contiguous, highest priority first, FIFO by
-- position inside a priority. Tail positions count up from GPOS0, head ones down.
local GPOS0 = 2251799813685248  -- 2^51
local BLOCKED = 1e15  -- gwait score of a group that waits for a concurrency slot
local QUEUE = '~q'    -- gstate / limits / gwait name of the whole queue (no hex has "~")

local function group_of(id)
  return string.match(id, '~(%x+)')
end

local function gentry(m)
  return string.sub(m, string.find(m, '~', 1, true) + 15)
end

-- Lex range bounds of group g's members in gready.
local function grange(g)
  return '[' .. g .. '~', '(' .. g .. '\127'
end

-- Add entries to their groups: items are {g, priority, entry}; head: in front of each
-- group (the last item ends up first, as with LPUSH). Returns false when a full Redis
-- refused the first write (nothing was written).
local function gpush(gready, gstate, items, head)
  local n = #items
  if n == 0 then return true end
  local c = redis.pcall('HINCRBY', gstate, 'pos', n)
  if not ok_reply(c) then return false end
  local args = {}
  for i, it in ipairs(items) do
    local k = c - n + i
    local pos = head and (GPOS0 - k) or (GPOS0 + k)
    args[#args + 1] = 0
    args[#args + 1] = it[1] .. '~' .. (9 - it[2]) .. string.format('%013x', pos) .. it[3]
  end
  redis.call('ZADD', gready, unpack(args))
  return true
end

-- The virtual time a group (re)joins at: the front of the rotation, so a newcomer gets
-- its turn in the next round but no credit for the time it had no work.
local function gvt(groups, gstate)
  local first = redis.call('ZRANGE', groups, 0, 0, 'WITHSCORES')
  if first[2] then return tonumber(first[2]) end
  return tonumber(redis.call('HGET', gstate, 'vt') or '0')
end

-- Group g has ready jobs: it joins the rotation unless it is there or waits (gwait).
local function gwake(groups, gwait, gstate, g)
  if redis.call('ZSCORE', groups, g) or redis.call('ZSCORE', gwait, g) then return end
  redis.call('ZADD', groups, gvt(groups, gstate), g)
end

-- A limit "rate,burst,concurrency,max_pending,weight" (empty field: none) as a table.
local function limit_of(v)
  if not v then return nil end
  local r, b, c, m, w = string.match(v, '^([^,]*),([^,]*),([^,]*),([^,]*),([^,]*)$')
  if not r then return nil end
  return {rate = tonumber(r), burst = tonumber(b), conc = tonumber(c), max = tonumber(m),
          weight = tonumber(w) or 1}
end

-- Tokens in bucket f (gstate "<f>:t" / "<f>:ts") now; the state is written only when
-- tokens are taken (take_tokens), never on a refused take, so a throttled bucket refills.
local function burst_of(lim)
  return lim.burst or math.max(1, math.ceil(lim.rate / 10))
end

local function tokens(gstate, f, lim, now)
  local v = redis.call('HMGET', gstate, f .. ':t', f .. ':ts')
  local burst = burst_of(lim)
  local t, ts = tonumber(v[1]), tonumber(v[2])
  if not t or not ts then return burst end
  return math.min(burst, t + math.max(0, now - ts) * lim.rate / 1000)
end

local function take_tokens(gstate, f, left, now)
  redis.call('HSET', gstate, f .. ':t', left, f .. ':ts', now)
end

-- When the bucket holding `t` tokens is worth a look again (ms, server clock): when it
-- has `most` tokens (a turn's worth) or 10 ms of them, whichever is fewer, at least one.
-- Waking for every single token would make a fast limit cost one fetch per job.
local function next_token(t, lim, now, most)
  local need = math.max(1, math.min(most, burst_of(lim), lim.rate / 100))
  return now + math.max(1, math.ceil((need - t) * 1000 / lim.rate))
end

-- Add delta[g] to field "<g><suffix>" of gstate for every group g in order: one HMGET
-- and one HSET however many groups (a batch of 100 jobs may hold 100 groups).
local function gadd(gstate, order, delta, suffix)
  if #order == 0 then return end
  local f = {}
  for i, g in ipairs(order) do f[i] = g .. suffix end
  local v = redis.call('HMGET', gstate, unpack(f))
  local set = {}
  for i, g in ipairs(order) do
    set[#set + 1] = f[i]
    set[#set + 1] = math.max(0, (tonumber(v[i]) or 0) + delta[g])
  end
  redis.call('HSET', gstate, unpack(set))
end

-- Jobs of groups that left their leases: finished (they also leave the quota count
-- "<g>:n") or only given back / retried (`finished` false). The groups' running counts
-- go down (a group's fields, its hold's reason too, go once it has no unfinished job),
-- and a group that waited for a concurrency slot is due again (wake token); so is a
-- queue that waited for one ("~q:blk"). ids: job ids (only grouped ones count). A few
-- commands per call, not per job or group.
local function gsettle(gstate, gwait, wake, ids, finished)
  local per, order = {}, {}
  for _, id in ipairs(ids) do
    local g = string.find(id, '~', 1, true) and group_of(id)
    if g then
      if not per[g] then order[#order + 1] = g; per[g] = 0 end
      per[g] = per[g] + 1
    end
  end
  local woke = false
  if #order > 0 then
    local f = {}
    for i, g in ipairs(order) do
      f[2 * i - 1] = g .. ':run'
      f[2 * i] = g .. ':n'
    end
    local v = redis.call('HMGET', gstate, unpack(f))
    local set, del = {}, {}
    for i, g in ipairs(order) do
      local run = math.max(0, (tonumber(v[2 * i - 1]) or 0) - per[g])
      local n = tonumber(v[2 * i]) or 0
      if finished then n = n - per[g] end
      if n <= 0 and run == 0 then
        del[#del + 1] = f[2 * i - 1]
        del[#del + 1] = f[2 * i]
        del[#del + 1] = g .. ':why'  -- a hold's reason (hold.lua) goes with its work
      else
        set[#set + 1] = f[2 * i - 1]
        set[#set + 1] = run
        set[#set + 1] = f[2 * i]
        set[#set + 1] = math.max(n, 0)
      end
    end
    if #set > 0 then redis.call('HSET', gstate, unpack(set)) end
    if #del > 0 then redis.call('HDEL', gstate, unpack(del)) end
    if redis.call('ZCARD', gwait) > 0 then
      local sc = redis.call('ZMSCORE', gwait, unpack(order))
      for i, g in ipairs(order) do
        if sc[i] and tonumber(sc[i]) >= BLOCKED then
          redis.call('ZADD', gwait, 0, g)
          woke = true
        end
      end
    end
  end
  if #ids > 0 and redis.call('HDEL', gstate, QUEUE .. ':blk') == 1 then woke = true end
  if woke then leave_wake_token(wake) end
end

-- Job events (batchq/events.py). A queue's events are on while its config hash (KEYS
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
