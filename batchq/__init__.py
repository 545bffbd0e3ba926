"""batchq: a Redis-backed job queue for Python built for throughput."""

from __future__ import annotations

from .app import App
from .breaker import BreakerOpen
from .campaign import Campaign, CampaignStats
from .codec import Job
from .context import JobContext, current_job
from .errors import (
    BatchqError,
    CampaignClosed,
    CampaignNotFound,
    EnqueueError,
    JobCancelled,
    JobDead,
    LockLost,
    LockNotAcquired,
    NotReplicated,
    PayloadTooLarge,
    QuotaExceeded,
    RateLimited,
    ResultNotKept,
    Retry,
)
from .events import Event
from .jobinfo import JobInfo
from .limits import GroupState, Limit
from .load import CurrentJob
from .lock import Lock
from .periodic import Schedule, periodic_status, run_scheduler
from .producer import Call, call
from .queue import DeadJob, DeadRetention, Queue, QueueStats
from .task import Task, TaskCall, TaskConfig
from .worker import JobFailed, Worker, WorkerSettings, run_worker

__version__ = "0.6.0"

__all__ = [
    "App",
    "BatchqError",
    "BreakerOpen",
    "Call",
    "Campaign",
    "CampaignClosed",
    "CampaignNotFound",
    "CampaignStats",
    "CurrentJob",
    "DeadJob",
    "DeadRetention",
    "EnqueueError",
    "Event",
    "GroupState",
    "Job",
    "JobCancelled",
    "JobContext",
    "JobDead",
    "JobFailed",
    "JobInfo",
    "Limit",
    "Lock",
    "LockLost",
    "LockNotAcquired",
    "NotReplicated",
    "PayloadTooLarge",
    "Queue",
    "QueueStats",
    "QuotaExceeded",
    "RateLimited",
    "ResultNotKept",
    "Retry",
    "Schedule",
    "Task",
    "TaskCall",
    "TaskConfig",
    "Worker",
    "WorkerSettings",
    "__version__",
    "call",
    "current_job",
    "periodic_status",
    "run_scheduler",
    "run_worker",
]
