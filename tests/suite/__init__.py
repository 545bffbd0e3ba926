"""The suite's own tools: the session reaper, the delivery checker, the fault proxy."""
