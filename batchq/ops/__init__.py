"""What an operator reads and does: Queue, stats, overview, metrics and their server,
health, events, audit, job info, tracing, logs."""
