"""Periodic jobs: schedules, the tick script, the scheduler and its takeover."""
