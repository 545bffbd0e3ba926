"""batchq: a Redis-backed job queue for Python built for throughput."""

from __future__ import annotations

from .app import App, Task, TaskCall, TaskConfig
from .codec import Job
from .errors import BatchqError, EnqueueError, PayloadTooLarge, Retry
from .producer import Call, call
from .queue import DeadJob, DeadRetention, Queue, QueueStats
from .worker import JobFailed, Worker, WorkerSettings, run_worker

__version__ = "0.1.0"

__all__ = [
    "App",
    "BatchqError",
    "Call",
    "DeadJob",
    "DeadRetention",
    "EnqueueError",
    "Job",
    "JobFailed",
    "PayloadTooLarge",
    "Queue",
    "QueueStats",
    "Retry",
    "Task",
    "TaskCall",
    "TaskConfig",
    "Worker",
    "WorkerSettings",
    "__version__",
    "call",
    "run_worker",
]
