"""``App``: the task registry and the ``@app.task`` decorator; where a job starts.

A job's way begins here: ``task.enqueue(...)`` resolves the task's settings and options
into a plan (``producer.plan``) and hands it, with the app's ``Clients``, to the
producer. The per-process clients themselves live in ``clients.py``: an ``App`` holds
plain settings only until a client is asked for, and clients are re-created after a
fork, so the supervisor can import the app and fork workers safely.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from datetime import datetime
from typing import Any, ParamSpec, TypeVar, overload

import redis
from redis.asyncio import Redis as AsyncRedis

from ..flow.breaker import Breaker, BreakerConfig, Guard, check_binding
from ..ops import events as events_
from ..ops import jobinfo
from ..ops.events import Event, Since
from ..ops.jobinfo import JobInfo
from ..ops.queue import DeadRetention, Queue
from ..produce import campaign as campaigns_
from ..produce import producer
from ..produce.campaign import DEFAULT_CAMPAIGN_TTL_S, Campaign, CampaignStats
from ..store.clients import Clients
from ..store.codec import Job
from ..store.connection import RedisSettings, redact, resolve_url
from ..store.keys import QueueKeys, check_queue_name
from ..store.replicas import Durability
from ..store.scripts import AsyncScripts, SyncScripts
from . import results
from .durations import check_seconds
from .lock import Lock
from .task import DEFAULT_QUEUE, Task, TaskConfig

P = ParamSpec("P")
R = TypeVar("R")


class App:
    """A batchq application: where the tasks are registered and how Redis is reached.

    ``redis_url``: ``None`` means ``$BATCHQ_REDIS_URL``, else ``redis://127.0.0.1:6379/0``.
    ``namespace`` prefixes every key, so several apps can share one Redis.
    ``dead_max_age_s`` / ``dead_max_count``: retention of each queue's dead-letter store
    (``None``: ``$BATCHQ_DEAD_MAX_AGE_S`` / ``$BATCHQ_DEAD_MAX_COUNT``, else 7 days and
    100,000 jobs; 0 turns that limit off), applied by ``Queue.trim_dead``.
    ``min_replicas``: an enqueue returns only once this many replicas hold its jobs
    (``WAIT``, within ``replica_timeout_ms``; ``replica_fsync=True``: ``WAITAOF``, in
    their AOF), else raises ``NotReplicated``; a worker waits for them once per flush of
    its acks. ``sentinel_password``: the Sentinels' own password, for a
    ``redis+sentinel://`` URL that does not carry ``sentinel_password``.
    """

    def __init__(
        self,
        redis_url: str | None = None,
        namespace: str = "batchq",
        *,
        max_payload_bytes: int = 1 << 20,
        dead_max_age_s: float | None = None,
        dead_max_count: int | None = None,
        min_replicas: int = 0,
        replica_timeout_ms: int = 1000,
        replica_fsync: bool = False,
        sentinel_password: str | None = None,
    ) -> None:
        if not isinstance(namespace, str) or not namespace or \
                any(c in namespace for c in "{}: \t\r\n"):
            raise ValueError(f"invalid namespace {namespace!r}")
        if type(max_payload_bytes) is not int or max_payload_bytes < 1:
            raise ValueError(f"max_payload_bytes must be a positive int, got "
                             f"{max_payload_bytes!r}")
        self.clients = Clients(RedisSettings(resolve_url(redis_url),
                                             sentinel_password=sentinel_password),
                               namespace, max_payload_bytes)
        # enqueues (and a worker's ack flushes) wait for this many replicas (replicas.py)
        self.clients.durability = Durability(min_replicas, replica_timeout_ms, replica_fsync)
        if min_replicas and self.clients.settings.cluster:
            raise ValueError("min_replicas is not supported on Redis Cluster (a WAIT must "
                             "go to the node that took the write); use min_replicas=0")
        self.namespace = namespace
        self.dead_retention = DeadRetention.resolve(dead_max_age_s, dead_max_count)
        self.tasks: dict[str, Task[..., Any]] = {}
        self.breakers: dict[str, Breaker] = {}

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
        result_ttl_s: float | None = None,
        key_ttl_s: float = ...,
        shards: int | None = None,
        max_hold_s: float = ...,
        max_refunds: int = ...,
        breaker: str | None = None,
        fallback: Task[..., Any] | str | None = None,
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
        result_ttl_s: None = None,
        key_ttl_s: float = ...,
        shards: int | None = None,
        max_hold_s: float = ...,
        max_refunds: int = ...,
        breaker: str | None = None,
        fallback: Task[..., Any] | str | None = None,
    ) -> Callable[[Callable[[list[Job]], Any]], Task[..., Any]]: ...

    def task(self, fn: Callable[..., Any] | None = None, /, **options: Any) -> Any:
        """Register a handler: ``@app.task`` or ``@app.task(queue=..., ...)``.

        ``result_ttl_s``: keep each run's return value (msgpack, at most
        ``max_payload_bytes``) this long, for ``app.result``; None (default): not kept.
        Every duration is checked here: at most ten years (``durations.MAX_DURATION_S``).
        ``max_hold_s`` / ``max_refunds``: bounds of a handler's ``RateLimited``
        (``batchq.tasks.errors``: 300 s and 20 by default).
        ``breaker``: a circuit breaker (``app.breaker``) whose open state holds this
        task's jobs, attempts not charged; ``fallback``: a task of the same queue its
        jobs are re-routed to meanwhile (``batchq.flow.breaker``).
        ``batch_size=N`` makes a batch handler, called with up to N ``batchq.Job``; it
        may return a mapping of job id to exception (or message) for the jobs that
        failed: only those are retried. Raising fails the whole batch.
        """

        def register(f: Callable[..., Any]) -> Task[..., Any]:
            queue = options.get("queue", DEFAULT_QUEUE)
            options["breaker"], options["fallback"] = check_binding(
                self.tasks, self.breakers, options.get("breaker"), options.get("fallback"),
                queue)
            cfg = TaskConfig(name=options.pop("name", None) or f.__name__, **options)
            if cfg.name in self.tasks:
                raise ValueError(f"a task named {cfg.name!r} is already registered")
            check_queue_name(cfg.queue)  # validates the queue name now
            if cfg.shards is not None:
                self.clients.shards.configure(cfg.queue, cfg.shards)
            t: Task[..., Any] = Task(self, f, cfg)
            self.tasks[cfg.name] = t
            return t

        return register(fn) if fn is not None else register

    def queues(self) -> list[str]:
        """The queues this app's tasks use, in registration order."""
        return list(dict.fromkeys(t.config.queue for t in self.tasks.values()))

    def queue(self, name: str = DEFAULT_QUEUE, *, shards: int | None = None) -> Queue:
        """Inspection and dead-letter operations on one queue. ``shards=N`` spreads it
        over N sub-queues for every task of this app that writes to it (``batchq.store.shards``;
        one count per queue and app)."""
        if shards is not None:
            self.clients.shards.configure(check_queue_name(name), shards)
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

    # --- results, status, cancel (batchq/tasks/results.py) ------------------------------------

    def result(self, job_id: str, timeout_s: float = 10.0) -> Any:
        """The return value of job ``job_id`` (a task with ``result_ttl_s``), waiting up to
        ``timeout_s`` for it without polling. Raises ``batchq.JobDead`` (with the dead
        record) if it was dead-lettered, ``batchq.JobCancelled`` if it was cancelled,
        ``batchq.JobExpired`` if it expired before it started, ``TimeoutError`` if it did
        not finish in time, ``KeyError`` if the job is unknown or its result expired,
        ``batchq.ResultNotKept`` (a ``KeyError``) at once when the tasks of its queue keep
        no result."""
        return results.result(self, job_id, timeout_s)

    async def aresult(self, job_id: str, timeout_s: float = 10.0) -> Any:
        """``result`` for asyncio code."""
        return await results.aresult(self, job_id, timeout_s)

    def job_status(self, job_id: str) -> str:
        """``"ready"``, ``"delayed"`` (also a retry waiting for its backoff),
        ``"reserved"`` (running), ``"succeeded"`` (while its result is kept),
        ``"dead"`` (while the dead-letter store keeps it), ``"cancelled"`` (for
        ``results.CANCEL_KEEP_S``), ``"expired"`` (an hour after it expired unstarted)
        or ``"unknown"`` (never seen, or finished and
        forgotten: a task without ``result_ttl_s`` keeps no trace of a success)."""
        return results.job_status(self, job_id)

    def job_info(self, job_id: str) -> JobInfo:
        """The state (as ``job_status``) and what Redis still keeps of the job: queue,
        task, attempt, progress and message (``current_job().progress``), last error,
        group, campaign, times. See ``batchq.ops.jobinfo``."""
        return jobinfo.job_info(self, job_id)

    async def ajob_info(self, job_id: str) -> JobInfo:
        """``job_info`` for asyncio code."""
        return await jobinfo.ajob_info(self, job_id)

    def cancel(self, job_id: str) -> bool:
        """Cancel a job that waits (ready or delayed): True if it will never run, False
        if it is running, finished, already cancelled or unknown. Safe against a worker
        popping it at the same moment: exactly one of the two wins."""
        return results.cancel(self, job_id)

    async def acancel(self, job_id: str) -> bool:
        """``cancel`` for asyncio code."""
        return await results.acancel(self, job_id)

    def events(self, queues: Sequence[str] | None = None, since: Since = "0",
               follow: bool = False) -> Iterator[Event]:
        """The job events of ``queues`` (default: this app's), from ``since`` (an event
        id, ``"0"`` the oldest kept, ``"$"`` new ones only, a ``datetime``, or queue ->
        id); ``follow``: wait for new ones forever. See ``batchq.ops.events``."""
        return events_.read(self.redis, self._event_keys(queues), since, follow)

    def aevents(self, queues: Sequence[str] | None = None, since: Since = "0",
                follow: bool = False) -> AsyncIterator[Event]:
        """``events`` for asyncio code (``async for``)."""
        return events_.aread(self.async_redis(), self._event_keys(queues), since, follow)

    def _event_keys(self, queues: Sequence[str] | None) -> list[QueueKeys]:
        if isinstance(queues, str):
            queues = [queues]
        return [q.keys for name in (queues if queues is not None else self.queues())
                for q in self.queue(check_queue_name(name)).shards()]

    def breaker(self, name: str, **config: Any) -> Guard:
        """Circuit breaker ``name``, shared by the fleet: ``app.breaker("twilio",
        failures=20, within_s=10, open_s=30, half_open_jobs=3, exceptions=(...))``
        defines it (again with the same settings: no-op); ``async with
        app.breaker("twilio"):`` (or ``with``) runs a call behind it. See
        ``batchq.flow.breaker``."""
        b = self.breakers.get(name) if isinstance(name, str) else None
        if config or b is None:
            if not config:
                raise ValueError(f"no breaker named {name!r}: define it with "
                                 f"app.breaker({name!r}, failures=..., within_s=..., "
                                 "open_s=...)")
            cfg = BreakerConfig(name, **config)
            if b is not None and b.config != cfg:
                raise ValueError(f"breaker {name!r} is already defined as {b.config}")
            if b is None:
                b = self.breakers[name] = Breaker(self.clients, cfg)
        return b.guard()

    # --- locks and periodic jobs (batchq/tasks/lock.py, batchq/produce/periodic.py) ---------------

    def lock(self, name: str, *, ttl_s: float = 60.0,
             blocking_timeout_s: float | None = 0.0) -> Lock:
        """A named distributed lock: ``with app.lock("nightly-export", ttl_s=60):``
        (or ``async with``). ``blocking_timeout_s``: 0 tries once, ``None`` waits
        without limit. See ``batchq.tasks.lock.Lock``."""
        return Lock(self.clients, name, ttl_s=ttl_s, blocking_timeout_s=blocking_timeout_s)

    def periodic(self, *, cron: str | None = None, every_s: float | None = None,
                 tz: str = "UTC", catch_up: bool = False, grace_s: float | None = None,
                 **task_options: Any) -> Callable[[Callable[P, R]], Task[P, R]]:
        """Register a task that runs on a schedule: ``@app.periodic(cron="*/5 * * * *",
        tz="UTC")`` or ``@app.periodic(every_s=30)``; other options as ``app.task``.
        See ``batchq.produce.periodic``."""
        from ..produce.periodic import register

        def decorate(fn: Callable[P, R]) -> Task[P, R]:
            task: Callable[..., Any] = self.task  # the options are app.task's, checked there
            t: Task[P, R] = task(**task_options)(fn)
            return register(self, t, cron=cron, every_s=every_s, tz=tz, catch_up=catch_up,
                            grace_s=grace_s)

        return decorate

    # --- campaigns (batchq/produce/campaign.py) ----------------------------------------------

    def campaign(self, campaign_id: str | None = None, *,
                 on_complete: Task[..., Any] | None = None,
                 campaign_ttl_s: float = DEFAULT_CAMPAIGN_TTL_S,
                 expires_at: datetime | float | None = None) -> Campaign:
        """The campaign ``campaign_id``, created unless it exists (a new id when None;
        an existing campaign keeps its settings). ``on_complete(campaign_id,
        stats_dict)`` is enqueued exactly once when it is sealed and nothing is pending;
        its record is kept ``campaign_ttl_s`` after that. ``expires_at`` (a datetime or
        Unix seconds; set when the campaign is created): its jobs not started by then
        never run, counted ``expired``. Use as ``with app.campaign(...) as c:`` to seal
        on a clean exit."""
        check_seconds("campaign_ttl_s", campaign_ttl_s, positive=True)
        cid = campaigns_.create(self.clients, campaign_id, on_complete, campaign_ttl_s,
                                expires_at)
        return Campaign(self.clients, cid)

    def campaigns(self, limit: int = 100) -> list[CampaignStats]:
        """The newest ``limit`` campaigns whose records are kept, newest first."""
        return list(campaigns_.list_stats(self.clients, limit))
