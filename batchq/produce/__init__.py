"""The producer's side of a job: an enqueue resolved, chunked and written; campaigns and
periodic ticks."""
