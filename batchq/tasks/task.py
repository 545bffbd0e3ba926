"""Tasks: ``TaskConfig`` (what ``@app.task(...)`` declared), ``Task`` (the registered
handler, which enqueues its own jobs) and ``TaskCall`` (a task with enqueue options).

A task needs only its app's per-process ``Clients`` to enqueue, so this module sits
below ``app.py``: the scheduler (``periodic.py``) and the worker use tasks without the
``App`` type.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any, Generic, ParamSpec, Protocol, TypeVar

from ..produce import producer, tracked
from ..produce.plan import Plan
from ..produce.producer import EnqueueOptions, GroupFn, KeyFn
from ..store import codec, shards
from ..store.clients import Clients
from ..store.keys import MAX_PRIORITY, split_shard
from .durations import check_seconds
from .errors import DEFAULT_MAX_HOLD_S, DEFAULT_MAX_REFUNDS, MAX_REFUNDS, MIN_HOLD_S

P = ParamSpec("P")
R = TypeVar("R")

DEFAULT_QUEUE = "default"

PLAN_CACHE = 64
"""Plans kept per task (or options view): one per shard it writes to, and keyed or not."""


class HasId(Protocol):
    """A campaign (``batchq.Campaign``), for ``options(campaign=...)``."""

    @property
    def id(self) -> str: ...


class TaskOwner(Protocol):
    """What a task needs of its app (``App`` is one)."""

    @property
    def clients(self) -> Clients: ...

    @property
    def namespace(self) -> str: ...

    @property
    def redis_url(self) -> str: ...

    @property
    def max_payload_bytes(self) -> int: ...


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
    result_ttl_s: float | None = None
    """Keep each job's return value this long (``app.result``); None: not stored."""
    key_ttl_s: float = tracked.DEFAULT_KEY_TTL_S
    """How long a dedup key stays held after its job finished."""
    shards: int | None = None
    """Spread the queue over this many sub-queues (``batchq.store.shards``); None: as
    configured elsewhere (``app.queue(name, shards=)``), else 1."""
    max_hold_s: float = DEFAULT_MAX_HOLD_S
    """The longest hold a ``RateLimited`` from this task's handler may set; a longer
    ``retry_after_s`` is cut to it."""
    max_refunds: int = DEFAULT_MAX_REFUNDS
    """How many ``RateLimited`` runs in a row a job gets with its attempt refunded; the
    next one counts as a failed attempt (retried after the hold, or dead-lettered)."""
    breaker: str | None = None
    """The circuit breaker (``app.breaker``) its jobs wait for while it is open."""
    fallback: str | None = None
    """The task its jobs are re-routed to while its breaker is open (same queue)."""

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
            check_seconds("timeout_s", self.timeout_s, positive=True)
        check_seconds("retry_backoff_s", self.retry_backoff_s)
        check_seconds("retry_backoff_max_s", self.retry_backoff_max_s)
        if self.result_ttl_s is not None:
            # Redis refuses an expiry past 2**63 ms: checked here, never at the ack
            check_seconds("result_ttl_s", self.result_ttl_s, positive=True)
            if round(self.result_ttl_s * 1000) < 1:
                raise ValueError(f"result_ttl_s must be at least 0.001, got "
                                 f"{self.result_ttl_s!r}")
            if self.batch_size is not None:
                raise ValueError("result_ttl_s is for single-job tasks: a batch handler "
                                 "returns failures, not results")
        check_seconds("key_ttl_s", self.key_ttl_s)
        if self.shards is not None:
            shards.check_shards(self.shards)
        check_seconds("max_hold_s", self.max_hold_s, min_s=MIN_HOLD_S, max_s=86400)
        codec.check_int("max_refunds", self.max_refunds, 0, MAX_REFUNDS)
        if self.breaker is not None and self.batch_size is not None:
            raise ValueError("breaker is for single-job tasks, not batch handlers")

    @property
    def result_ttl_ms(self) -> int | None:
        """``result_ttl_s`` in ms (None: results are not stored)."""
        return None if self.result_ttl_s is None else round(self.result_ttl_s * 1000)


class _Enqueuer:
    """The enqueue methods shared by a task and its ``.options(...)`` view."""

    _task: Task[..., Any]
    _opts: EnqueueOptions

    _plans: dict[tuple[str, bool, int], Plan]
    """Plans already built, by (queue written to, keyed, payload limit)."""

    def _plan(self, keyed: bool = False, shard: int | None = None) -> Plan:
        t, o = self._task, self._opts
        c = t.config
        queue = c.queue if o.queue is None else o.queue
        if not isinstance(queue, str):
            return self._new_plan(queue, keyed)  # refused, naming the value
        queue = self._shard(queue, keyed, shard)
        # a plan depends only on the task's config and these options (both frozen), the
        # (sub-)queue written to and the payload limit: built once, not on every call
        ck = (queue, keyed, t.app.clients.max_payload_bytes)
        p = self._plans.get(ck)
        if p is None:
            p = self._new_plan(queue, keyed)
            if len(self._plans) < PLAN_CACHE:
                self._plans[ck] = p
        return p

    def _new_plan(self, queue: Any, keyed: bool) -> Plan:
        t, o = self._task, self._opts
        c = t.config
        p = producer.plan(
            t.app.clients,
            c.name,
            queue,
            c.priority if o.priority is None else o.priority,
            c.max_attempts if o.max_attempts is None else o.max_attempts,
            o.delay_s,
            o.eta,
            campaign=o.campaign,
            key_ttl_s=o.key_ttl_s if o.key_ttl_s is not None else
            # a replaced or debounced key is held while its job waits or runs, then free
            0.0 if o.on_conflict in ("replace", "debounce")
            and c.key_ttl_s == tracked.DEFAULT_KEY_TTL_S else c.key_ttl_s,
            keyed=keyed or o.key is not None,
            group=o.group,
            timeout_s=o.timeout_s,
            on_conflict=o.on_conflict,
            expires_s=o.expires_s,
            expires_at=o.expires_at,
            keep_expired=o.keep_expired,
        )
        return p if o.min_replicas is None else replace(p, min_replicas=o.min_replicas)

    def _count(self, queue: str) -> int:
        """The shard count of ``queue`` in this app (1: not sharded, or a shard named
        directly)."""
        try:
            base, k = split_shard(queue)
        except ValueError:
            return 1  # plan() names the bad queue
        return 1 if k else self._task.app.clients.shards.count(base)

    def _shard(self, queue: str, keyed: bool, shard: int | None) -> str:
        """The sub-queue a write goes to: a group's or a dedup key's own shard (so its
        limits and uniqueness stay exact), else this process's next one in turn."""
        n = self._count(queue)
        if n == 1:
            return queue
        o = self._opts
        if o.group is not None and (keyed or o.key is not None):
            raise ValueError(f"queue {queue!r} is sharded (shards={n}): a job with both a "
                             "group and a dedup key cannot be routed (a group lives in one "
                             "shard, a key in another); use one of them")
        if o.group is not None:
            k = shards.stable(o.group if isinstance(o.group, str) else "", n)
        elif o.key is not None:
            k = shards.stable(o.key if isinstance(o.key, str) else "", n)
        elif keyed:
            raise ValueError(f"queue {queue!r} is sharded (shards={n}): enqueue_many with "
                             "key_fn is not supported there (each key lives in its own "
                             "shard); enqueue keyed jobs one by one with options(key=...)")
        elif shard is not None:
            k = shard
        else:
            k = self._task.app.clients.shards.turn(queue, n)
        return shards.shard_name(queue, k)

    def _many(self, key_fn: KeyFn | None, group_fn: GroupFn | None = None
              ) -> tuple[Plan, list[Plan] | None]:
        if self._opts.key is not None:
            raise ValueError(f"options(key={self._opts.key!r}) names one job: give "
                             "enqueue_many a key_fn (one key per item) instead")
        if key_fn is not None and not callable(key_fn):
            raise TypeError(f"key_fn must be callable, got {key_fn!r}")
        if group_fn is not None and not callable(group_fn):
            raise TypeError(f"group_fn must be callable, got {group_fn!r}")
        c, o = self._task.config, self._opts
        queue = c.queue if o.queue is None else o.queue
        n = self._count(queue) if isinstance(queue, str) else 1
        if group_fn is not None and n > 1:
            raise ValueError(f"queue {queue!r} is sharded (shards={n}): enqueue_many with "
                             "group_fn is not supported there (each group lives in its own "
                             "shard); enqueue each group's jobs with options(group=...)")
        p = self._plan(keyed=key_fn is not None)
        if n == 1 or o.group is not None:
            return p, None
        # chunks go to the shards in turn, starting at this process's next one
        first = self._task.app.clients.shards.turn(queue, n)
        return p, [self._plan(shard=(first + i) % n) for i in range(n)]

    def enqueue(self, *args: Any, **kwargs: Any) -> str:
        """Write one job; returns its id once Redis has it (with a dedup key already
        held: the id of the job holding it, and nothing is written)."""
        return producer.enqueue(self._task.app.clients, self._plan(), args, kwargs,
                                key=self._opts.key)

    def enqueue_many(self, items: Iterable[Any], *, key_fn: KeyFn | None = None,
                     group_fn: GroupFn | None = None) -> list[str]:
        """Write many jobs, streamed in pipelined chunks; returns their ids in order.

        Each item is a tuple or list of positional arguments, a dict of keyword
        arguments, a ``batchq.call(*args, **kwargs)``, or else one positional argument.
        ``key_fn(item)`` gives each job's dedup key (or None): an item whose key is held
        is not written and its place in the result has the holder's id.
        ``group_fn(item)`` gives each job's group (a str; None: the group of
        ``options(group=...)``, or none): the jobs of many groups go in one call, each
        chunk of 1,000 in one script call whatever its groups, exactly as one
        ``options(group=g).enqueue_many`` per group would write them (not on a sharded
        queue).
        """
        p, spread = self._many(key_fn, group_fn)
        return producer.enqueue_many(self._task.app.clients, p, items, key_fn, spread,
                                     group_fn)

    async def aenqueue(self, *args: Any, **kwargs: Any) -> str:
        """``enqueue`` for asyncio code."""
        return await producer.aenqueue(self._task.app.clients, self._plan(), args, kwargs,
                                       key=self._opts.key)

    async def aenqueue_many(self, items: Iterable[Any], *, key_fn: KeyFn | None = None,
                            group_fn: GroupFn | None = None) -> list[str]:
        """``enqueue_many`` for asyncio code."""
        p, spread = self._many(key_fn, group_fn)
        return await producer.aenqueue_many(self._task.app.clients, p, items, key_fn,
                                            spread, group_fn)

    def options(
        self,
        *,
        queue: str | None = None,
        priority: int | None = None,
        max_attempts: int | None = None,
        delay_s: float | None = None,
        eta: datetime | float | None = None,
        campaign: HasId | str | None = None,
        key: str | None = None,
        key_ttl_s: float | None = None,
        group: str | None = None,
        timeout_s: float | None = None,
        on_conflict: str | None = None,
        min_replicas: int | None = None,
        expires_s: float | None = None,
        expires_at: datetime | float | None = None,
        keep_expired: bool | None = None,
        not_before: datetime | float | None = None,
        window: str | None = None,
        tz: str | None = None,
    ) -> TaskCall:
        """A view of the task that enqueues with other options (``eta``: datetime or
        Unix seconds; naive datetimes are local time). ``campaign``: the jobs join it (a
        ``Campaign`` or its id); ``key``: a dedup key for ``enqueue``; ``key_ttl_s``: how
        long a key stays held after its job finished; ``group``: the jobs belong to
        that group of the queue (a tenant, a sender id): groups are served in turn, each
        within its limits (``Queue.limit``); ``timeout_s``: this job's run time limit,
        over the task's; ``on_conflict``: what a call does when its key is held by a
        job still waiting: ``"keep"`` it (the default), ``"replace"`` its arguments, or
        ``"debounce"``: replace them and start it ``delay_s`` after this call;
        ``min_replicas``: replicas that must confirm these jobs, over the app's
        (``App(min_replicas=...)``); ``expires_s`` / ``expires_at`` (a datetime or Unix
        seconds): a job not started by then never runs, counted ``expired`` (and kept in
        the dead letters, reason ``expired``, with ``keep_expired=True``);
        ``not_before``: as ``eta``; ``window`` (``"09:00-20:00"``, optionally with days:
        ``"09:00-20:00 mon-fri"``) in ``tz``: the job starts at the window's next
        opening in the recipient's time zone (a delayed job)."""
        cid = campaign if campaign is None or isinstance(campaign, str) else campaign.id
        extra = EnqueueOptions(queue, priority, max_attempts, delay_s, eta, cid, key,
                               key_ttl_s, group, timeout_s, on_conflict, min_replicas,
                               expires_s=expires_s, expires_at=expires_at,
                               keep_expired=keep_expired, not_before=not_before,
                               window=window, tz=tz)
        return TaskCall(self._task, self._opts.merged(extra))


class TaskCall(_Enqueuer):
    """A task with enqueue options bound: ``task.options(delay_s=60).enqueue(...)``."""

    def __init__(self, task: Task[..., Any], opts: EnqueueOptions) -> None:
        self._task = task
        self._opts = opts
        self._plans = {}


class Task(_Enqueuer, Generic[P, R]):
    """A registered handler. Calling it runs the function directly, as before."""

    def __init__(self, app: TaskOwner, fn: Callable[P, R], config: TaskConfig) -> None:
        self.app = app
        self.fn = fn
        self.config = config
        self.is_async = inspect.iscoroutinefunction(fn)
        self.is_batch = config.batch_size is not None
        self.result_ttl_ms = config.result_ttl_ms
        """How long a run's return value is kept (ms); None: it is not stored."""
        self._task = self
        self._opts = EnqueueOptions()
        self._plans = {}
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
