"""batchq: a Redis-backed job queue for Python built for throughput."""

from __future__ import annotations

import importlib as _importlib
import sys as _sys
import types as _types
import warnings as _warnings
from collections.abc import Sequence as _Sequence
from importlib import abc as _abc
from importlib import machinery as _machinery

from .flow.breaker import BreakerOpen
from .flow.limits import GroupState, Limit
from .load import CurrentJob
from .ops.events import Event
from .ops.jobinfo import JobInfo
from .ops.queue import DeadJob, DeadRetention, Queue, QueueStats
from .produce.campaign import Campaign, CampaignStats
from .produce.periodic import Schedule, periodic_status, run_scheduler
from .produce.producer import Call, call
from .store.codec import Job
from .tasks.app import App
from .tasks.context import JobContext, current_job
from .tasks.errors import (
    BatchqError,
    CampaignClosed,
    CampaignNotFound,
    EnqueueError,
    JobCancelled,
    JobDead,
    JobExpired,
    LockLost,
    LockNotAcquired,
    NotReplicated,
    PayloadTooLarge,
    QuotaExceeded,
    RateLimited,
    ResultNotKept,
    Retry,
)
from .tasks.handler_redis import BatchingRedis
from .tasks.lock import Lock
from .tasks.task import Task, TaskCall, TaskConfig
from .worker import JobFailed, Worker, WorkerSettings, run_worker

__version__ = "0.8.0"

__all__ = [
    "App",
    "BatchingRedis",
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
    "JobExpired",
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


# --- module paths that moved: importable under their old name for one release ---------

_MOVED: dict[str, str] = {
    "_twins": "store._twins",
    "app": "tasks.app",
    "audit": "ops.audit",
    "breaker": "flow.breaker",
    "calendars": "flow.calendars",
    "campaign": "produce.campaign",
    "clients": "store.clients",
    "codec": "store.codec",
    "connection": "store.connection",
    "connlimit": "ops.connlimit",
    "context": "tasks.context",
    "durable": "store.durable",
    "durations": "tasks.durations",
    "errors": "tasks.errors",
    "events": "ops.events",
    "exitcodes": "worker.exitcodes",
    "flow_metrics": "flow.metrics",
    "flow_view": "flow.view",
    "health": "ops.health",
    "ids": "store.ids",
    "jobinfo": "ops.jobinfo",
    "keys": "store.keys",
    "lane": "store.lane",
    "limits": "flow.limits",
    "loadgen": "load.schedule",
    "loading": "tasks.loading",
    "lock": "tasks.lock",
    "logs": "ops.logs",
    "metrics": "ops.metrics",
    "metrics_http": "ops.metrics_http",
    "options": "produce.options",
    "otel": "ops.otel",
    "overview": "ops.overview",
    "periodic": "produce.periodic",
    "plan": "produce.plan",
    "producer": "produce.producer",
    "queue": "ops.queue",
    "replicas": "store.replicas",
    "results": "tasks.results",
    "scripts": "store.scripts",
    "sentinel": "store.sentinel",
    "seqs": "produce.seqs",
    "shards": "store.shards",
    "stats": "ops.stats",
    "stream": "produce.chunks",
    "supervisor": "worker.supervisor",
    "supervisor_metrics": "worker.supervisor_metrics",
    "task": "tasks.task",
    "tracked": "produce.tracked",
    "web_settings": "web.settings",
    "windows": "flow.windows",
}
"""Old module path -> new one, both relative to ``batchq`` (a package maps its
submodules too). Importing an old path gives the module itself, with one
``DeprecationWarning`` per path and process; nothing is left at the old place."""


def _moved_to(fullname: str) -> str | None:
    head, _, rest = fullname.partition(".")
    if head != __name__ or not rest:
        return None
    parts = rest.split(".")
    for i in range(len(parts), 0, -1):
        new = _MOVED.get(".".join(parts[:i]))
        if new is not None:
            return ".".join([__name__, new, *parts[i:]])
    return None


class _MovedLoader(_abc.Loader):
    def __init__(self, old: str, new: str) -> None:
        self.old, self.new = old, new

    def create_module(self, spec: _machinery.ModuleSpec) -> _types.ModuleType:
        module = _importlib.import_module(self.new)
        self.spec = module.__spec__
        _warnings.warn(f"{self.old} moved to {self.new}; the old path goes in the next "
                       "release", DeprecationWarning, stacklevel=_importer_level())
        return module

    def exec_module(self, module: _types.ModuleType) -> None:
        module.__spec__ = self.spec  # the import system set the alias's spec on it


class _MovedFinder(_abc.MetaPathFinder):
    def find_spec(self, fullname: str, path: _Sequence[str] | None,
                  target: _types.ModuleType | None = None) -> _machinery.ModuleSpec | None:
        new = _moved_to(fullname)
        if new is None:
            return None
        return _machinery.ModuleSpec(fullname, _MovedLoader(fullname, new))


def _importer_level() -> int:
    """The ``stacklevel`` from ``_MovedLoader.create_module`` to the code that imported
    (past ``importlib``; ``warnings`` itself does not count the ``_bootstrap`` frames)."""
    frame: _types.FrameType | None = _sys._getframe(2)
    level = 1
    while frame is not None:
        name = frame.f_code.co_filename
        if not ("importlib" in name and "_bootstrap" in name):
            level += 1
        if "importlib" not in name and name != __file__:
            break
        frame = frame.f_back
    return level


def __getattr__(name: str) -> object:
    """``batchq.<old module>`` as an attribute, through the same warning."""
    if name in _MOVED:
        return _importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


if not any(isinstance(f, _MovedFinder) for f in _sys.meta_path):
    _sys.meta_path.insert(0, _MovedFinder())
