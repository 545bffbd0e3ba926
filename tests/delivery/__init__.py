"""At-least-once delivery: retries, dead letters, redrive, crashes, kills, clocks,
poison jobs, bad entries."""
