-- _lib.lua: the library every batchq script draws on (not a script of its own). Its
-- definitions live in topic include files, read in this order (scripts/__init__.py
-- LIBRARY; a definition uses only those above it):
--   _entries.lua  server time, the job header, an entry's attempt
--   _dead.lua     dead records (a minimal msgpack writer)
--   _writes.lua   writes a full Redis may refuse, the wake token, the pending index
--   _leases.lua   the in-flight hash, lease names, crash marks
--   _bundles.lua  bundles: the plain jobs of one pop under one lease
--   _tracked.lua  campaign and dedup jobs settled
--   _waiting.lua  the ready-job bitmaps (sequence numbers)
--   _groups.lua   flow control: groups, limits, tokens, waits
--   _windows.lua  calendar quotas and send windows (boundary lists from Python)
--   _events.lua   job events (the events stream)
--   _pop_*.lua    the phases of pop.lua, in the order it runs them
-- Each script is sent only the definitions it names, directly or through another one
-- (library_for), so a definition nobody uses costs nothing.
--
-- An encoded job ("entry") is   <priority>:<attempt>:<max_attempts>:<id>:<msgpack body>
-- priority is one digit 0..9, attempt is how many runs have started, id has no ':'.

-- Constants the Python side mirrors (batchq/flow/limits.py BLOCKED, QUEUE_FIELD).
local BLOCKED = 1e15  -- gwait score of a group that waits for a concurrency slot
local QUEUE = '~q'    -- gstate / limits / gwait name of the whole queue (no hex has "~")

