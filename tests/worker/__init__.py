"""Workers and the supervisor: pop/ack/extend/release, bundles, hand-off, read-ahead,
queue selection, GC, memory cap, concurrency bounds."""
