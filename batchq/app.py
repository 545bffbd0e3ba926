"""``App``: the task registry, the ``@app.task`` decorator and per-process clients.

An ``App`` holds plain settings only until a client is asked for; clients (sync, and one
asyncio client per event loop) are created lazily and re-created after a fork, so the
supervisor can import the app and fork workers safely.
"""

from __future__ import annotations

import asyncio
import inspect
import os
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, Generic, ParamSpec, TypeVar, overload

import redis
import redis.asyncio
from redis.asyncio import Redis as AsyncRedis

from . import producer
from .codec import Job
from .connection import RedisSettings, redact, resolve_url
from .keys import MAX_PRIORITY, QueueKeys, queues_key
from .lock import Lock
from .producer import EnqueueOptions
from .scripts import AsyncScripts, SyncScripts

if TYPE_CHECKING:
    from .queue import Queue

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
        if not 0 <= self.priority <= MAX_PRIORITY:
            raise ValueError(f"priority must be 0..{MAX_PRIORITY}, got {self.priority}")
        if self.max_attempts < 1:
            raise ValueError("max_attempts must be at least 1")
        if self.batch_size is not None and not 1 <= self.batch_size <= 1000:
            raise ValueError("batch_size must be 1..1000")
        if self.timeout_s is not None and self.timeout_s <= 0:
            raise ValueError("timeout_s must be positive")
        if ":" in self.name:
            raise ValueError(f"task name {self.name!r} must not contain ':'")


class _Enqueuer:
    """The enqueue methods shared by a task and its ``.options(...)`` view."""

    _task: Task[..., Any]
    _opts: EnqueueOptions

    def _plan(self) -> producer._Plan:
        t, o = self._task, self._opts
        c = t.config
        return producer.plan(
            t.app,
            c.name,
            o.queue or c.queue,
            c.priority if o.priority is None else o.priority,
            c.max_attempts if o.max_attempts is None else o.max_attempts,
            o.delay_s,
            o.eta,
        )

    def enqueue(self, *args: Any, **kwargs: Any) -> str:
        """Write one job; returns its id once Redis has it."""
        return producer.enqueue(self._task.app, self._plan(), args, kwargs)

    def enqueue_many(self, items: Iterable[Any]) -> list[str]:
        """Write many jobs, streamed in pipelined chunks; returns their ids in order.

        Each item is a tuple or list of positional arguments, a dict of keyword
        arguments, a ``batchq.call(*args, **kwargs)``, or else one positional argument.
        """
        return producer.enqueue_many(self._task.app, self._plan(), items)

    async def aenqueue(self, *args: Any, **kwargs: Any) -> str:
        """``enqueue`` for asyncio code."""
        return await producer.aenqueue(self._task.app, self._plan(), args, kwargs)

    async def aenqueue_many(self, items: Iterable[Any]) -> list[str]:
        """``enqueue_many`` for asyncio code."""
        return await producer.aenqueue_many(self._task.app, self._plan(), items)

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
    """

    def __init__(
        self,
        redis_url: str | None = None,
        namespace: str = "batchq",
        *,
        max_payload_bytes: int = 1 << 20,
    ) -> None:
        if not namespace or any(c in namespace for c in "{}: \t\r\n"):
            raise ValueError(f"invalid namespace {namespace!r}")
        self.redis_settings = RedisSettings(resolve_url(redis_url))
        self.namespace = namespace
        self.max_payload_bytes = max_payload_bytes
        self.tasks: dict[str, Task[..., Any]] = {}
        self._keys: dict[str, QueueKeys] = {}
        self._pid = -1
        self._sync: redis.Redis | None = None
        self._sync_scripts: SyncScripts | None = None
        self._async: dict[asyncio.AbstractEventLoop, tuple[AsyncRedis, AsyncScripts]] = {}
        self._registered: set[str] = set()
        self._coalescers: dict[asyncio.AbstractEventLoop, producer.Coalescer] = {}
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"App(redis_url={redact(self.redis_url)!r}, namespace={self.namespace!r})"

    @property
    def redis_url(self) -> str:
        return self.redis_settings.url

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
        from .queue import Queue

        return Queue(self, name)

    def keys(self, queue: str) -> QueueKeys:
        k = self._keys.get(queue)
        if k is None:
            k = self._keys[queue] = QueueKeys(self.namespace, queue)
        return k

    # --- clients ---------------------------------------------------------------------

    def _check_fork(self) -> None:
        if self._pid != os.getpid():
            # a forked child: never touch the parent's sockets
            self._pid = os.getpid()
            self._sync = None
            self._sync_scripts = None
            self._async = {}
            self._coalescers = {}
            self._registered = set()

    @property
    def redis(self) -> redis.Redis:
        """The synchronous client of this process."""
        self._check_fork()
        if self._sync is None:
            with self._lock:
                if self._sync is None:
                    self._sync = self.redis_settings.sync_client()
        return self._sync

    @property
    def sync_scripts(self) -> SyncScripts:
        if self._sync_scripts is None or self._pid != os.getpid():
            self._sync_scripts = SyncScripts(self.redis)
        return self._sync_scripts

    def _async_pair(self) -> tuple[AsyncRedis, AsyncScripts]:
        self._check_fork()
        loop = asyncio.get_running_loop()
        pair = self._async.get(loop)
        if pair is None:
            for old in [lp for lp in self._async if lp.is_closed()]:
                del self._async[old]
            client = self.redis_settings.async_client()
            pair = self._async[loop] = (client, AsyncScripts(client))
        return pair

    def coalescer(self) -> producer.Coalescer:
        """The ``aenqueue`` coalescer of the running event loop."""
        self._check_fork()
        loop = asyncio.get_running_loop()
        c = self._coalescers.get(loop)
        if c is None:
            for old in [lp for lp in self._coalescers if lp.is_closed()]:
                del self._coalescers[old]
            c = self._coalescers[loop] = producer.Coalescer()
        return c

    def async_redis(self) -> AsyncRedis:
        """The asyncio client of the running event loop (one per loop)."""
        return self._async_pair()[0]

    def async_scripts(self) -> AsyncScripts:
        return self._async_pair()[1]

    def register_queue(self, queue: str) -> None:
        """Record the queue name in the namespace's registry (once per process)."""
        self._check_fork()
        if queue not in self._registered:
            self.redis.sadd(queues_key(self.namespace), queue)
            self._registered.add(queue)

    async def aregister_queue(self, queue: str) -> None:
        self._check_fork()
        if queue not in self._registered:
            await self.async_redis().sadd(queues_key(self.namespace), queue)
            self._registered.add(queue)

    def close(self) -> None:
        """Close the synchronous client (asyncio clients close with ``aclose``)."""
        if self._sync is not None:
            self._sync.close()
            self._sync = None

    async def aclose(self) -> None:
        """Close the asyncio client of the running loop."""
        pair = self._async.pop(asyncio.get_running_loop(), None)
        if pair is not None:
            await pair[0].aclose()

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
