"""The state one worker process shares between its stages (fetch, run, outcomes,
leases, registry), and the settings it runs with.

Every stage holds the same :class:`State` and reads or changes it on the one event
loop: no locks. A job's way through it: ``fetch`` puts it in ``held`` (the leases this
process holds) and ``work`` (not started yet); a runner takes it from ``work``; an
outcome moves it from ``held`` to ``buf`` (results not written yet); the flush writes
``buf`` to Redis. ``leases`` extends everything in ``held`` and ``buf``.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import os
import random
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import redis
from redis.asyncio import Redis as AsyncRedis
from redis.exceptions import RedisClusterException

from ..store import shards
from ..store.codec import Job
from ..store.keys import QueueKeys
from ..store.lane import AsyncLane, async_lane
from ..store.scripts import AsyncScripts
from ..tasks.durations import check_seconds
from .exitcodes import EXIT_OK
from .phase import MOVES, Phase, PhaseError, StopReason
from .selection import check_selection

if TYPE_CHECKING:
    from ..ops.metrics import Recorder
    from ..tasks.app import App
    from ..tasks.task import Task

CHUNK = 1000
"""Leases per script call (Lua's unpack limit is about 8000 arguments)."""

PROMOTE_CHUNK = 100
"""Delayed jobs moved and expired leases reaped per pop call."""

BURST_POLL_S = 0.2
"""In burst mode, how often an idle worker re-checks whether the queues are done."""

STOP_GRACE_S = 2.0
"""How long a stop waits for cancelled handlers (and helper tasks) to finish."""

METRICS_EVERY_S = 1.0
"""How often counts aggregated in the process are published to prometheus_client."""

YIELD_EVERY_S = 0.05
"""A runner that ran jobs without yielding for this long yields once, so the flusher
writes the finished jobs' acks: the bound on how long a finished job's ack waits in
this process (plus one Redis round trip), unless one handler itself blocks the loop."""

RUN_EWMA_ALPHA = 0.1
"""Weight of the newest sample in ``State.run_s`` (about the last 10-20 samples count)."""

RUN_SAMPLE_MASK = 7
"""A job is timed for ``State.run_s`` when it starts while the count of settled jobs is
a multiple of 8 (so every job starting before the first one settled is timed)."""

GC_THRESHOLD = 10_000
"""Default ``WorkerSettings.gc_threshold``: with Python's 700, the jobs in flight
(thousands of objects coming and going) set off a collection every few hundred jobs,
and the survivors a full one every ~50,000 (~30 ms each, scanning every module's
objects): a fifth to a third of a drain's CPU."""

_CONNECTION_ERRORS = (redis.ConnectionError, redis.TimeoutError, OSError)
REDIS_ERRORS = (*_CONNECTION_ERRORS, redis.RedisError, RedisClusterException, RuntimeError)
"""Any failed Redis call: a lost connection, a refusal (OOM, READONLY, NOPERM), and on a
cluster ``ClusterError`` ("TTL exhausted": a slot kept answering TRYAGAIN/ASK while it
migrated) or ``SlotNotCoveredError`` (a stale slot map; not a ``RedisError``). Under
uvloop, writing to a connection the server has reset raises ``RuntimeError("unable to
perform operation on <TCPTransport closed=True>...")`` instead of a ConnectionError
(redis-py drops the connection first, so the next call reconnects): it is a lost
connection too. Only Redis calls sit inside ``except REDIS_ERRORS``."""


MAX_CONCURRENCY = 10_000
"""The most jobs one worker process may run at once (``WorkerSettings.concurrency``):
far above what one event loop serves well (use more processes), low enough that the
prefetch it sizes and the threads a sync handler may take stay within one machine."""


MAX_GC_THRESHOLD = 2**31 - 1
"""The largest first-generation threshold ``gc.set_threshold`` takes (a C int)."""


@dataclass(frozen=True)
class WorkerSettings:
    """How one worker process runs."""

    queues: tuple[str, ...] = ()
    """Queues to serve; empty means every queue the app's tasks use."""
    concurrency: int = 100
    """Jobs run at once, 1 to ``MAX_CONCURRENCY``. Runners are made as jobs arrive, not
    upfront, so a high cap costs nothing while it is not used."""
    lease_s: float = 30.0
    fetch_batch: int = 100
    burst: bool = False
    shutdown_timeout_s: float = 30.0
    max_block_s: float = 5.0
    """Longest idle wait between two looks at Redis (bounds idle command rate)."""
    max_jobs: int | None = None
    """Stop gracefully after this many jobs (recycling, for leaky handlers)."""
    max_memory_mb: int | None = None
    """Stop gracefully once the process's RSS passes this many MiB (checked every
    second), exiting ``EXIT_MEMORY``: the supervisor replaces it (``worker.memory``)."""
    supervisor_restarts: tuple[tuple[str, int], ...] = ()
    """The supervisor's replacements by reason when it forked this process (shown by
    ``batchq info`` through the worker registry)."""
    install_signal_handlers: bool = True
    metrics: bool = True
    """Count jobs for Prometheus (``batchq.ops.metrics``); off saves a little per job."""
    heartbeat_path: str | None = None
    """A file whose mtime the loop refreshes every ``heartbeat_interval_s``; the
    supervisor kills a child whose file goes stale (a blocked event loop)."""
    heartbeat_interval_s: float = 1.0
    start_paused: bool = False
    """Start with fetching paused (a child forked while its supervisor is paused)."""
    order: str = "rotate"
    """How several queues are served: ``"rotate"`` (the order rotates every fetch, the
    free slots split evenly, or by ``weights``) or ``"strict"`` (drain the first queue
    before the next, like a multi-key BLPOP). See ``worker.selection``."""
    weights: tuple[int, ...] = ()
    """One weight (1..1000) per queue of ``queues`` (rotating order only): the free
    slots are split in proportion. Empty: equal shares."""
    gc_threshold: int = GC_THRESHOLD
    """The worker process's first-generation threshold of Python's cyclic garbage
    collector (``gc.set_threshold``), the objects alive at start (imports, the app)
    frozen out of its scans (``gc.freeze``); 0 leaves the collector as the app set it.
    See ``worker.run_worker``."""

    def __post_init__(self) -> None:
        c = self.concurrency
        if isinstance(c, bool) or not isinstance(c, int) or not 1 <= c <= MAX_CONCURRENCY:
            raise ValueError(f"concurrency must be a whole number from 1 to "
                             f"{MAX_CONCURRENCY:,} (use more processes beyond), not {c!r}")
        check_seconds("lease_s", self.lease_s, min_s=1)
        if not 1 <= self.fetch_batch <= CHUNK:
            raise ValueError(f"fetch_batch must be 1..{CHUNK}, not {self.fetch_batch!r}")
        if self.max_jobs is not None and self.max_jobs < 1:
            raise ValueError(f"max_jobs must be at least 1, not {self.max_jobs!r}")
        if self.max_memory_mb is not None and not (
                isinstance(self.max_memory_mb, int) and self.max_memory_mb >= 1):
            raise ValueError(f"max_memory_mb must be a whole number of MiB, at least 1, "
                             f"not {self.max_memory_mb!r}")
        if not self.heartbeat_interval_s > 0:
            raise ValueError(f"heartbeat_interval_s must be positive, not "
                             f"{self.heartbeat_interval_s!r}")
        if not 0 <= self.gc_threshold <= MAX_GC_THRESHOLD:
            raise ValueError(f"gc_threshold must be 0 (leave the collector alone) to "
                             f"{MAX_GC_THRESHOLD:,}, not {self.gc_threshold!r}")
        check_selection(self.queues, self.order, self.weights)


@dataclass
class Counters:
    """What this process did, for progress output and tests."""

    fetched: int = 0
    succeeded: int = 0
    failed: int = 0
    retried: int = 0
    dead: int = 0
    released: int = 0
    held: int = 0
    """Jobs given back by ``RateLimited``."""
    stale_acks: int = 0
    leases_lost: int = 0
    promoted: int = 0
    reaped: int = 0
    recovered: int = 0
    """Jobs popped that dead workers had held repeatedly (each run alone)."""
    by_reason: dict[str, int] = field(default_factory=dict)


@dataclass
class Buffers:
    """Results waiting to be written, per queue (tasks and reasons kept for metrics,
    which count an outcome only once Redis took it: a stale lease changes nothing)."""

    acks: list[bytes] = field(default_factory=list)
    ack_tasks: list[str] = field(default_factory=list)
    retries: list[tuple[bytes, int, str, str]] = field(default_factory=list)
    """(lease, retry delay in ms, task, error: for the "retried" event)"""
    dead: list[tuple[bytes, bytes, str, str]] = field(default_factory=list)
    """(lease, dead record, task, reason)"""
    results: list[tuple[bytes, int, bytes, str, str]] = field(default_factory=list)
    """Acks that keep a result: (lease, result TTL in ms, msgpack result, task, job id)"""
    holds: list[tuple[bytes, int, str]] = field(default_factory=list)
    """Jobs given back by ``RateLimited``: (lease, hold of their group in ms, task)"""

    def extend(self, other: Buffers) -> None:
        self.acks += other.acks
        self.ack_tasks += other.ack_tasks
        self.retries += other.retries
        self.dead += other.dead
        self.results += other.results
        self.holds += other.holds

    def leases(self) -> list[bytes]:
        return [*self.acks, *(r[0] for r in self.retries), *(d[0] for d in self.dead),
                *(r[0] for r in self.results), *(h[0] for h in self.holds)]

    def __bool__(self) -> bool:
        return bool(self.acks or self.retries or self.dead or self.results or self.holds)


def backoff_s(base_s: float, max_s: float, attempt: int) -> float:
    """Exponential backoff with equal jitter: half fixed, half random."""
    d = min(max_s, base_s * 2.0 ** max(0, attempt - 1))
    return d / 2 + random.uniform(0, d / 2)


class State:
    """Everything the stages of one worker process share."""

    # set by open(), on the running loop
    loop: asyncio.AbstractEventLoop
    stop_event: asyncio.Event
    room: asyncio.Event
    """Set whenever a job settles (the fetcher may take more) or a stop begins."""
    flush_event: asyncio.Event
    """Set whenever a result is buffered (the flusher writes it)."""
    quiet: asyncio.Event
    """Set while no handler runs (a recovered job waits for it; see ``run``)."""
    redis: AsyncRedis
    bredis: AsyncRedis
    """The blocking-wait connection (socket timeout longer than the block)."""
    blane: AsyncLane | None
    """Its lane (``lane.py``: the BLPOP and its reply skip redis-py's per-command
    machinery); None on Redis Cluster."""
    scripts: AsyncScripts
    due_event: asyncio.Event
    """Set when ``due_campaigns`` gained an id."""
    closed: asyncio.Event
    """Set with ``Phase.CLOSING`` (stop step 4): the helper loops' pauses end at once."""

    def __init__(self, app: App, settings: WorkerSettings, worker_id: str | None) -> None:
        self.app = app
        self.settings = s = settings
        self.names: tuple[str, ...] = s.queues or tuple(app.queues()) or ("default",)
        """The queues served, as given (a sharded one once: ``shards``)."""
        self.queues: tuple[QueueKeys, ...] = ()
        """The sub-queues popped: every shard of each queue (``set_shards``)."""
        self.shards: list[list[int]] = []
        """Per queue of ``names``, the indices of its sub-queues in ``queues``."""
        self.by_name: dict[str, QueueKeys] = {}
        self.held: dict[str, dict[bytes, Job]] = {}
        """Leases this process holds whose outcome is not buffered yet, per sub-queue."""
        self.buf: dict[str, Buffers] = {}
        self.set_shards({n: shards.expand([n], app.clients.shards, {}) for n in self.names})
        self.worker_id = worker_id or f"{os.uname().nodename}:{os.getpid()}"
        self.counters = Counters()
        self.tasks: dict[str, Task[..., Any]] = app.tasks
        self.work: collections.deque[Job | list[Job]] = collections.deque()
        """Jobs fetched, not started (batch jobs grouped in lists)."""
        self.interrupted: list[Job] = []
        """Jobs whose run a stop cancelled: given back with release.lua."""
        self.in_flight = 0
        self.jobs_done = 0
        self.busy = 0
        """Handlers running now."""
        self._phase = Phase.RUNNING  # read it as ``phase``
        self.reason: StopReason | None = None
        """Why it stops, once a stop began."""
        self._paused = s.start_paused
        self.idle_runners: collections.deque[asyncio.Future[None]] = collections.deque()
        self.waking = 0
        """Runners woken (or made) that have not taken a job yet."""
        self.spawn_runner: Callable[[], asyncio.Task[None]] | None = None
        """Makes a new runner (``run.Runners.start`` sets it): runners are made as jobs
        arrive, at most ``concurrency`` of them, never one per slot upfront."""
        self.running: dict[asyncio.Task[Any] | None, Job | list[Job]] = {}
        """What each runner took last (for handlers that ignore cancellation)."""
        self.runner_tasks: list[asyncio.Task[None]] = []
        self.exit_code = EXIT_OK
        self.pool: ThreadPoolExecutor | None = None
        self.m: Recorder | None = None
        self.started_at = time.time()
        self.run_s: float | None = None
        """Moving average of a handler's wall time per job (a batch's time divided by
        its jobs; a sample of the jobs, ``RUN_SAMPLE_MASK``), once one ran: what sizes
        the prefetch (``fetch_size.Sizing.limit``)."""
        self.due_campaigns: set[str] = set()
        """Campaigns whose last pending job on a queue settled in this process's pop,
        ack or nack: ``campaigns.FollowUp`` tries to complete them."""
        self.completing = 0
        """Campaigns taken from ``due_campaigns`` whose try is under way: a burst run
        does not end before it is over (it may enqueue an ``on_complete`` job here)."""

    # --- the worker's life: every change of phase goes through these -------------------

    @property
    def phase(self) -> Phase:
        """Where the worker is in its life; changed only by the methods below (``stop``,
        ``close``, ``run_alone``, ``end_alone``): it cannot be assigned."""
        return self._phase

    @property
    def stopping(self) -> bool:
        """A stop began: nothing is fetched or started any more."""
        return self._phase >= Phase.DRAINING

    @property
    def closing(self) -> bool:
        """Stop step 4 began: the helper loops end."""
        return self._phase is Phase.CLOSING

    @property
    def paused(self) -> bool:
        """Fetching is paused (jobs in flight keep running); independent of the phase."""
        return self._paused

    @property
    def recycled(self) -> bool:
        """The worker stops because it reached ``max_jobs``."""
        return self.reason is StopReason.RECYCLED

    def _move(self, to: Phase) -> None:
        if to not in MOVES[self._phase]:
            raise PhaseError(f"a worker cannot go from {self._phase.name} to {to.name}")
        self._phase = to

    def stop(self, reason: StopReason, fast: bool = False) -> bool:
        """Begin a stop (stop step 1), or hurry one under way when ``fast``; wake what
        waits (the fetch loop, an idle wait, idle runners: they exit). The first reason
        given is kept. True when this call began the stop. Once closing, nothing
        changes: the stop is over but for the last writes."""
        if self._phase is Phase.CLOSING:
            return False
        began = self._phase < Phase.DRAINING
        if began:
            self.reason = reason
            self._move(Phase.HURRYING if fast else Phase.DRAINING)
        elif fast and self._phase is Phase.DRAINING:
            self._move(Phase.HURRYING)
        self.stop_event.set()
        self.room.set()
        self.wake_runners(len(self.idle_runners))
        return began

    def close(self) -> None:
        """Stop step 4: the helper loops end (``Phase.CLOSING``), their pauses cut
        short. Only after a stop."""
        self._move(Phase.CLOSING)
        self.closed.set()

    def run_alone(self) -> None:
        """A runner took a recovered job: no runner starts another until ``end_alone``.
        Runners take jobs only while ``RUNNING``, so this never comes in another phase."""
        self._move(Phase.ALONE)

    def end_alone(self) -> None:
        """The recovered job is over (or given back): runners may start jobs again,
        unless a stop began meanwhile (it keeps its phase)."""
        if self._phase is Phase.ALONE:
            self._move(Phase.RUNNING)
        elif self._phase is Phase.RUNNING:
            raise PhaseError("a worker ended running a job alone that it did not begin")

    def pause(self, paused: bool) -> bool:
        """Pause (or resume) fetching; jobs in flight keep running. True when it changed
        (the fetch loop is woken to see it)."""
        if paused == self._paused:
            return False
        self._paused = paused
        self.room.set()
        return True

    def set_shards(self, subs: dict[str, list[str]]) -> bool:
        """Serve these sub-queues of each queue of ``names`` (shards only ever added:
        a shard is served until the worker stops). True when one was added."""
        names = list(dict.fromkeys(k.queue for k in self.queues))
        groups: list[list[int]] = []
        for n in self.names:
            mine = []
            for sub in subs.get(n, [n]):
                if sub not in names:
                    names.append(sub)
                mine.append(names.index(sub))
            for i in (self.shards[len(groups)] if self.shards else ()):
                if i not in mine:
                    mine.append(i)
            groups.append(sorted(mine))
        if len(names) == len(self.queues) and groups == self.shards:
            return False
        self.queues = tuple(self.app.keys(q) for q in names)
        self.by_name = {k.queue: k for k in self.queues}
        self.shards = groups
        for k in self.queues:
            self.held.setdefault(k.queue, {})
            self.buf.setdefault(k.queue, Buffers())
        return True

    async def open(self) -> None:
        """Create what lives on the loop: events and the Redis clients."""
        self.loop = asyncio.get_running_loop()
        self.stop_event = asyncio.Event()
        self.room = asyncio.Event()
        self.flush_event = asyncio.Event()
        self.quiet = asyncio.Event()
        self.quiet.set()
        self.due_event = asyncio.Event()
        self.closed = asyncio.Event()
        s = self.settings
        self.redis = self.app.redis_settings.async_client()
        self.bredis = self.app.redis_settings.async_client(socket_timeout_s=s.max_block_s + 10)
        self.blane = async_lane(self.bredis)
        self.scripts = AsyncScripts(self.redis)

    def thread_pool(self) -> ThreadPoolExecutor:
        if self.pool is None:
            self.pool = ThreadPoolExecutor(self.settings.concurrency,
                                           thread_name_prefix="batchq-sync")
        return self.pool

    def wake_runners(self, n: int) -> None:
        """Wake up to ``n`` idle runners (all of them when stopping); when too few are
        idle, make new ones while fewer than ``concurrency`` exist."""
        idle = self.idle_runners
        while n > 0 and idle:
            fut = idle.popleft()
            if not fut.done():
                fut.set_result(None)
                self.waking += 1
                n -= 1
        spawn = self.spawn_runner
        if n > 0 and spawn is not None and self._phase < Phase.DRAINING:
            n = min(n, self.settings.concurrency - len(self.runner_tasks))
            for _ in range(n):
                self.runner_tasks.append(spawn())
                self.waking += 1  # the new runner counts as woken until it takes a job

    def note_run(self, elapsed_s: float, jobs: int) -> None:
        """A handler ran ``jobs`` jobs in ``elapsed_s`` of wall time."""
        per_job = elapsed_s / jobs if jobs > 1 else elapsed_s
        prev = self.run_s
        self.run_s = per_job if prev is None else prev + RUN_EWMA_ALPHA * (per_job - prev)

    def queued_by_queue(self) -> dict[str, int]:
        """Jobs fetched and not started, per queue."""
        queued: dict[str, int] = {}
        for item in self.work:
            q = item[0].queue if isinstance(item, list) else item.queue
            queued[q] = queued.get(q, 0) + (len(item) if isinstance(item, list) else 1)
        return queued

    async def sleep_unless_stopped(self, delay_s: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.stop_event.wait(), delay_s)

    async def sleep_unless_closed(self, delay_s: float) -> None:
        """A helper loop's pause, cut short by ``close`` (not by a stop: helpers keep
        running while jobs drain). Never waits when already closed, so a loop whose
        cancellation was swallowed inside a redis-py call still ends at once."""
        if self._phase is Phase.CLOSING:
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.closed.wait(), delay_s)
