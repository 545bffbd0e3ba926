"""Load testing: ``batchq bench load``, its schedule and histogram."""
