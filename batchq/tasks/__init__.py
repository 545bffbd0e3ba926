"""What user code defines and calls: App, Task, current_job, errors, locks, results."""
