-- _waiting.lua: the ready-job bitmaps.

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
-- one command each (set_bits), instead of one SETBIT per job); top: the next free number;
-- unordered: the numbers come in any order (sorted here first).
local function set_waiting(top, wait0, seqs, bit, unordered)
  local n = #seqs
  -- unordered (a grouped pop: its turns interleave its groups' runs): sorted first, in
  -- place, so a run costs one command, not one per job
  if unordered then table.sort(seqs) end
  local i = 1
  while i <= n do
    local j = i
    while j < n and seqs[j + 1] == seqs[j] + 1 do j = j + 1 end
    set_run(top, wait0, seqs[i], j - i + 1, bit)
    i = j + 1
  end
end
