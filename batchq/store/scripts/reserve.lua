-- reserve.lua: hand a producer a block of job sequence numbers (keys.py T:seq).
--
-- When the block enters a new generation, the bitmap slot that generation reuses (the
-- one 4 generations back) is emptied first: a job still waiting from then loses its
-- bit (status "unknown", cancel False; it still runs).
--
-- KEYS[1]  seq counter
-- KEYS[2..5]  waiting bitmaps, slots 0..3
-- ARGV[1]  block size (1 .. 2^23)
-- Returns  the first sequence number of the block.
local seq = KEYS[1]
local WAIT0 = 2  -- KEYS[WAIT0 + s] is the bitmap of slot s (0..3)

local n = tonumber(ARGV[1])
local top = redis.call('INCRBY', seq, n)
local first = top - n
local g0 = math.floor(first / WAIT_GEN)
if first > 0 then g0 = math.floor((first - 1) / WAIT_GEN) + 1 end
for g = g0, math.floor((top - 1) / WAIT_GEN) do
  redis.call('DEL', KEYS[WAIT0 + g % 4])
end
return first
