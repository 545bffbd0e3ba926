"""``App``: the task registry and the ``@app.task`` decorator; where a job starts.

A job's way begins here: ``task.enqueue(...)`` resolves the task's settings and options
into a plan (``producer.plan``) and hands it, with the app's ``Clients``, to the
producer. The per-process clients themselves live in ``clients.py``: an ``App`` holds
plain settings only until a client is asked for, and clients are re-created after a
fork, so the supervisor can import the app and fork workers safely.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Generic, ParamSpec, TypeVar, overload

import redis
from redis.asyncio import Redis as AsyncRedis

from . import codec, producer
from .clients import Clients
from .codec import Job
from .connection import RedisSettings, redact, resolve_url
from .keys import MAX_PRIORITY, QueueKeys
from .lock import Lock
from .producer import EnqueueOptions
from .queue import DeadRetention, Queue
from .scripts import AsyncScripts, SyncScripts

P = ParamSpec("P")
R = TypeVar("R")

DEFAULT_QUEUE = "default"


@dataclass(frozen=True)
class TaskConfig:
    """A task's settings as declared by ``@app.task(...)``."""

    name: str
    queue: str = DEFAULT_QUEUE
    priority: int = 0
    max_attempts: int = 3
    timeout_s: float | None = None
    batch_size: int | None = None
    retry_backoff_s: float = 1.0
    retry_backoff_max_s: float = 300.0

    def __post_init__(self) -> None:
        # every check names the setting: a wrong value must never reach the worker
        if not isinstance(self.name, str) or not self.name:
            raise TypeError(f"task name must be a non-empty str, got {self.name!r}")
        if ":" in self.name:
            raise ValueError(f"task name {self.name!r} must not contain ':'")
        if not isinstance(self.queue, str):
            raise TypeError(f"queue must be a str, got {type(self.queue).__name__} "
                            f"{self.queue!r}")
        codec.check_int("priority", self.priority, 0, MAX_PRIORITY)
        codec.check_int("max_attempts", self.max_attempts, 1, codec.MAX_ATTEMPTS)
        if self.batch_size is not None:
            codec.check_int("batch_size", self.batch_size, 1, 1000)
        if self.timeout_s is not None:
            _positive("timeout_s", self.timeout_s)
        _positive("retry_backoff_s", self.retry_backoff_s, zero_ok=True)
        _positive("retry_backoff_max_s", self.retry_backoff_max_s, zero_ok=True)


def _positive(name: str, value: object, *, zero_ok: bool = False) -> None:
    """A finite number > 0 (>= 0 with ``zero_ok``), or an error naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{name} must be a number, got {type(value).__name__} {value!r}")
    if not math.isfinite(value) or value < 0 or (value == 0 and not zero_ok):
        raise ValueError(f"{name} must be a finite number {'>=' if zero_ok else '>'} 0, "
                         f"got {value!r}")


class _Enqueuer:
    """The enqueue methods shared by a task and its ``.options(...)`` view."""

    _task: Task[..., Any]
    _opts: EnqueueOptions

    def _plan(self) -> producer._Plan:
        t, o = self._task, self._opts
        c = t.config
        return producer.plan(
            t.app.clients,
            c.name,
            c.queue if o.queue is None else o.queue,
            c.priority if o.priority is None else o.priority,
            c.max_attempts if o.max_attempts is None else o.max_attempts,
            o.delay_s,
            o.eta,
        )

    def enqueue(self, *args: Any, **kwargs: Any) -> str:
        """Write one job; returns its id once Redis has it."""
        return producer.enqueue(self._task.app.clients, self._plan(), args, kwargs)

    def enqueue_many(self, items: Iterable[Any]) -> list[str]:
        """Write many jobs, streamed in pipelined chunks; returns their ids in order.

        Each item is a tuple or list of positional arguments, a dict of keyword
        arguments, a ``batchq.call(*args, **kwargs)``, or else one positional argument.
        """
        return producer.enqueue_many(self._task.app.clients, self._plan(), items)

    async def aenqueue(self, *args: Any, **kwargs: Any) -> str:
        """``enqueue`` for asyncio code."""
        return await producer.aenqueue(self._task.app.clients, self._plan(), args, kwargs)

    async def aenqueue_many(self, items: Iterable[Any]) -> list[str]:
        """``enqueue_many`` for asyncio code."""
        return await producer.aenqueue_many(self._task.app.clients, self._plan(), items)

    def options(
        self,
        *,
        queue: str | None = None,
        priority: int | None = None,
        max_attempts: int | None = None,
        delay_s: float | None = None,
        eta: datetime | float | None = None,
    ) -> TaskCall:
        """A view of the task that enqueues with other options (``eta``: datetime or
        Unix seconds; naive datetimes are local time)."""
        extra = EnqueueOptions(queue, priority, max_attempts, delay_s, eta)
        return TaskCall(self._task, self._opts.merged(extra))


class TaskCall(_Enqueuer):
    """A task with enqueue options bound: ``task.options(delay_s=60).enqueue(...)``."""

    def __init__(self, task: Task[..., Any], opts: EnqueueOptions) -> None:
        self._task = task
        self._opts = opts


class Task(_Enqueuer, Generic[P, R]):
    """A registered handler. Calling it runs the function directly, as before."""

    def __init__(self, app: App, fn: Callable[P, R], config: TaskConfig) -> None:
        self.app = app
        self.fn = fn
        self.config = config
        self.is_async = inspect.iscoroutinefunction(fn)
        self.is_batch = config.batch_size is not None
        self._task = self
        self._opts = EnqueueOptions()
        self.__name__ = getattr(fn, "__name__", config.name)
        self.__doc__ = fn.__doc__
        self.__wrapped__ = fn

    @property
    def name(self) -> str:
        return self.config.name

    @property
    def queue(self) -> str:
        return self.config.queue

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        return self.fn(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<Task {self.config.name} queue={self.config.queue}>"


class App:
    """A batchq application: where the tasks are registered and how Redis is reached.

    ``redis_url``: ``None`` means ``$BATCHQ_REDIS_URL``, else ``redis://127.0.0.1:6379/0``.
    ``namespace`` prefixes every key, so several apps can share one Redis.
    ``dead_max_age_s`` / ``dead_max_count``: retention of each queue's dead-letter store
    (``None``: ``$BATCHQ_DEAD_MAX_AGE_S`` / ``$BATCHQ_DEAD_MAX_COUNT``, else 7 days and
    100,000 jobs; 0 turns that limit off), applied by ``Queue.trim_dead``.
    """

    def __init__(
        self,
        redis_url: str | None = None,
        namespace: str = "batchq",
        *,
        max_payload_bytes: int = 1 << 20,
        dead_max_age_s: float | None = None,
        dead_max_count: int | None = None,
    ) -> None:
        if not isinstance(namespace, str) or not namespace or \
                any(c in namespace for c in "{}: \t\r\n"):
            raise ValueError(f"invalid namespace {namespace!r}")
        if type(max_payload_bytes) is not int or max_payload_bytes < 1:
            raise ValueError(f"max_payload_bytes must be a positive int, got "
                             f"{max_payload_bytes!r}")
        self.clients = Clients(RedisSettings(resolve_url(redis_url)), namespace,
                               max_payload_bytes)
        self.namespace = namespace
        self.dead_retention = DeadRetention.resolve(dead_max_age_s, dead_max_count)
        self.tasks: dict[str, Task[..., Any]] = {}

    def __repr__(self) -> str:
        return f"App(redis_url={redact(self.redis_url)!r}, namespace={self.namespace!r})"

    @property
    def redis_url(self) -> str:
        return self.clients.settings.url

    @property
    def redis_settings(self) -> RedisSettings:
        return self.clients.settings

    @redis_settings.setter
    def redis_settings(self, value: RedisSettings) -> None:
        self.clients.settings = value

    @property
    def max_payload_bytes(self) -> int:
        return self.clients.max_payload_bytes

    @max_payload_bytes.setter
    def max_payload_bytes(self, value: int) -> None:
        self.clients.max_payload_bytes = value

    # --- tasks -----------------------------------------------------------------------

    @overload
    def task(self, fn: Callable[P, R], /) -> Task[P, R]: ...

    @overload
    def task(
        self,
        fn: None = None,
        /,
        *,
        name: str | None = None,
        queue: str = DEFAULT_QUEUE,
        priority: int = 0,
        max_attempts: int = 3,
        timeout_s: float | None = None,
        batch_size: None = None,
        retry_backoff_s: float = 1.0,
        retry_backoff_max_s: float = 300.0,
    ) -> Callable[[Callable[P, R]], Task[P, R]]: ...

    @overload
    def task(
        self,
        fn: None = None,
        /,
        *,
        name: str | None = None,
        queue: str = DEFAULT_QUEUE,
        priority: int = 0,
        max_attempts: int = 3,
        timeout_s: float | None = None,
        batch_size: int,
        retry_backoff_s: float = 1.0,
        retry_backoff_max_s: float = 300.0,
    ) -> Callable[[Callable[[list[Job]], Any]], Task[..., Any]]: ...

    def task(self, fn: Callable[..., Any] | None = None, /, **options: Any) -> Any:
        """Register a handler: ``@app.task`` or ``@app.task(queue=..., ...)``.

        ``batch_size=N`` makes a batch handler, called with up to N ``batchq.Job``; it
        may return a mapping of job id to exception (or message) for the jobs that
        failed: only those are retried. Raising fails the whole batch.
        """

        def register(f: Callable[..., Any]) -> Task[..., Any]:
            cfg = TaskConfig(name=options.pop("name", None) or f.__name__, **options)
            if cfg.name in self.tasks:
                raise ValueError(f"a task named {cfg.name!r} is already registered")
            self.keys(cfg.queue)  # validates the queue name now
            t: Task[..., Any] = Task(self, f, cfg)
            self.tasks[cfg.name] = t
            return t

        return register(fn) if fn is not None else register

    def queues(self) -> list[str]:
        """The queues this app's tasks use, in registration order."""
        return list(dict.fromkeys(t.config.queue for t in self.tasks.values()))

    def queue(self, name: str = DEFAULT_QUEUE) -> Queue:
        """Inspection and dead-letter operations on one queue."""
        return Queue(self, name)

    def keys(self, queue: str) -> QueueKeys:
        """The key names of ``queue`` (validates the name)."""
        return self.clients.keys(queue)

    # --- clients (kept for callers of 0.1; they live in ``self.clients``) -------------

    @property
    def redis(self) -> redis.Redis:
        """The synchronous client of this process."""
        return self.clients.redis

    @property
    def sync_scripts(self) -> SyncScripts:
        return self.clients.sync_scripts

    def async_redis(self) -> AsyncRedis:
        """The asyncio client of the running event loop (one per loop)."""
        return self.clients.async_redis()

    def async_scripts(self) -> AsyncScripts:
        return self.clients.async_scripts()

    def coalescer(self) -> producer.Coalescer:
        """The ``aenqueue`` coalescer of the running event loop."""
        return producer.coalescer(self.clients)

    def register_queue(self, queue: str) -> None:
        """Record the queue name in the namespace's registry (once per process)."""
        self.clients.register_queue(queue)

    async def aregister_queue(self, queue: str) -> None:
        await self.clients.aregister_queue(queue)

    def close(self) -> None:
        """Close the synchronous client (asyncio clients close with ``aclose``)."""
        self.clients.close()

    async def aclose(self) -> None:
        """Close the asyncio client of the running loop."""
        await self.clients.aclose()

    # --- locks and periodic jobs (batchq/lock.py, batchq/periodic.py) ------------------

    def lock(self, name: str, *, ttl_s: float = 60.0,
             blocking_timeout_s: float | None = 0.0) -> Lock:
        """A named distributed lock: ``with app.lock("nightly-export", ttl_s=60):``
        (or ``async with``). ``blocking_timeout_s``: 0 tries once, ``None`` waits
        without limit. See ``batchq.lock.Lock``."""
        return Lock(self, name, ttl_s=ttl_s, blocking_timeout_s=blocking_timeout_s)

    def periodic(self, *, cron: str | None = None, every_s: float | None = None,
                 tz: str = "UTC", catch_up: bool = False, grace_s: float | None = None,
                 **task_options: Any) -> Callable[[Callable[P, R]], Task[P, R]]:
        """Register a task that runs on a schedule: ``@app.periodic(cron="*/5 * * * *",
        tz="UTC")`` or ``@app.periodic(every_s=30)``; other options as ``app.task``.
        See ``batchq.periodic``."""
        from .periodic import register

        def decorate(fn: Callable[P, R]) -> Task[P, R]:
            return register(self, fn, cron=cron, every_s=every_s, tz=tz, catch_up=catch_up,
                            grace_s=grace_s, task_options=task_options)

        return decorate
