"""One worker process: an event loop that fetches, runs and acknowledges jobs.

Tasks of the loop:

* **fetch** — one ``pop.lua`` call per queue per round (pipelined across queues, the
  queue order rotating for fairness) pops up to ``fetch_batch`` jobs and reserves them
  with a lease; it also promotes due delayed jobs and reaps expired leases. When no queue
  has work the fetcher blocks (``BLPOP`` on the queues' wake lists, on its own
  connection) until an enqueue wakes it, the next delayed job is due, or a lease expires.
* **runners** — ``concurrency`` coroutines take jobs from the local buffer and run them:
  async handlers inline, plain functions in a thread pool, batch handlers with a list.
* **flush** — acks, retries and dead letters are buffered and written in batches
  (``ack.lua``/``nack.lua``), re-sent after a connection error (both are idempotent).
* **extend** — every third of the lease, ``extend.lua`` pushes the deadline of every
  held job, so a long job keeps its lease; a crashed worker stops extending and the
  reaper hands its jobs out again.

Graceful stop (SIGTERM): stop fetching, let running jobs finish until
``shutdown_timeout_s`` (then cancel them), give back the jobs that never started (and the
cancelled ones) with ``release.lua``, flush, exit 0.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import os
import random
import signal
import time
import traceback
from collections.abc import Awaitable, Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import redis
import redis.asyncio
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.exceptions import RedisClusterException

from . import codec
from .codec import Job
from .errors import Retry
from .exitcodes import EXIT_RECYCLED
from .keys import QueueKeys, worker_info_key, workers_key
from .metrics import bump
from .scripts import AsyncScript, AsyncScripts, arun_pipeline

if TYPE_CHECKING:
    from .metrics import Recorder

if TYPE_CHECKING:
    from .app import App, Task

log = logging.getLogger("batchq.worker")

CHUNK = 1000
PROMOTE_CHUNK = 100
"""Delayed jobs moved and expired leases reaped per pop call."""

BURST_POLL_S = 0.2
"""In burst mode, how often an idle worker re-checks whether the queues are done."""

STOP_GRACE_S = 2.0
"""How long a stop waits for cancelled handlers (and helper tasks) to finish."""

METRICS_EVERY_S = 1.0
"""How often counts aggregated in the process are published to prometheus_client."""

REGISTRY_EVERY_S = 5.0
"""How often a worker refreshes its entry in the worker registry."""


_CONNECTION_ERRORS = (redis.ConnectionError, redis.TimeoutError, OSError)
_REDIS_ERRORS = (*_CONNECTION_ERRORS, redis.RedisError, RedisClusterException, RuntimeError)
"""Any failed Redis call: a lost connection, a refusal (OOM, READONLY, NOPERM), and on a
cluster ``ClusterError`` ("TTL exhausted": a slot kept answering TRYAGAIN/ASK while it
migrated) or ``SlotNotCoveredError`` (a stale slot map; not a ``RedisError``). Under
uvloop, writing to a connection the server has reset raises ``RuntimeError("unable to
perform operation on <TCPTransport closed=True>...")`` instead of a ConnectionError
(redis-py drops the connection first, so the next call reconnects): it is a lost
connection too. Only Redis calls sit inside ``except _REDIS_ERRORS``."""


@dataclass(frozen=True)
class WorkerSettings:
    """How one worker process runs."""

    queues: tuple[str, ...] = ()
    """Queues to serve; empty means every queue the app's tasks use."""
    concurrency: int = 100
    lease_s: float = 30.0
    fetch_batch: int = 100
    burst: bool = False
    shutdown_timeout_s: float = 30.0
    max_block_s: float = 5.0
    """Longest idle wait between two looks at Redis (bounds idle command rate)."""
    max_jobs: int | None = None
    """Stop gracefully after this many jobs (recycling, for leaky handlers)."""
    install_signal_handlers: bool = True
    metrics: bool = True
    """Count jobs for Prometheus (``batchq.metrics``); off saves a little per job."""
    heartbeat_path: str | None = None
    """A file whose mtime the loop refreshes every ``heartbeat_interval_s``; the
    supervisor kills a child whose file goes stale (a blocked event loop)."""
    heartbeat_interval_s: float = 1.0
    start_paused: bool = False
    """Start with fetching paused (a child forked while its supervisor is paused)."""

    def __post_init__(self) -> None:
        if self.concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        if self.lease_s < 1:
            raise ValueError("lease_s must be at least 1 second")
        if not 1 <= self.fetch_batch <= CHUNK:
            raise ValueError(f"fetch_batch must be 1..{CHUNK}")


@dataclass
class Counters:
    """What this process did, for progress output and tests."""

    fetched: int = 0
    succeeded: int = 0
    failed: int = 0
    retried: int = 0
    dead: int = 0
    released: int = 0
    stale_acks: int = 0
    leases_lost: int = 0
    promoted: int = 0
    reaped: int = 0
    by_reason: dict[str, int] = field(default_factory=dict)


@dataclass
class _Buffers:
    """Results waiting to be written, per queue (tasks and reasons kept for metrics,
    which count an outcome only once Redis took it: a stale lease changes nothing)."""

    acks: list[bytes] = field(default_factory=list)
    ack_tasks: list[str] = field(default_factory=list)
    retries: list[tuple[bytes, int, str]] = field(default_factory=list)
    """(lease, retry delay in ms, task)"""
    dead: list[tuple[bytes, bytes, str, str]] = field(default_factory=list)
    """(lease, dead record, task, reason)"""

    def extend(self, other: _Buffers) -> None:
        self.acks += other.acks
        self.ack_tasks += other.ack_tasks
        self.retries += other.retries
        self.dead += other.dead

    def __bool__(self) -> bool:
        return bool(self.acks or self.retries or self.dead)


def backoff_s(base_s: float, max_s: float, attempt: int) -> float:
    """Exponential backoff with equal jitter: half fixed, half random."""
    d = min(max_s, base_s * 2.0 ** max(0, attempt - 1))
    return d / 2 + random.uniform(0, d / 2)


class Worker:
    """Runs the jobs of some queues in this process until stopped (or, in burst mode,
    until the queues are empty)."""

    def __init__(self, app: App, settings: WorkerSettings | None = None,
                 *, worker_id: str | None = None) -> None:
        self.app = app
        self.settings = s = settings or WorkerSettings()
        names = s.queues or tuple(app.queues()) or ("default",)
        self.queues: tuple[QueueKeys, ...] = tuple(app.keys(q) for q in names)
        self.worker_id = worker_id or f"{os.uname().nodename}:{os.getpid()}"
        self.counters = Counters()
        self._tasks: dict[str, Task[..., Any]] = app.tasks
        self._work: collections.deque[Job | list[Job]] = collections.deque()
        self._held: dict[str, dict[bytes, Job]] = {k.queue: {} for k in self.queues}
        self._buf: dict[str, _Buffers] = {k.queue: _Buffers() for k in self.queues}
        self._interrupted: list[Job] = []
        self._in_flight = 0
        self._jobs_done = 0
        self._idle_runners: collections.deque[asyncio.Future[None]] = collections.deque()
        self._rotation = 0
        self._stopping = False
        self._fast = False
        self._pool: ThreadPoolExecutor | None = None
        self._blpop: asyncio.Task[Any] | None = None
        self._wake_tasks: dict[str, asyncio.Task[None]] = {}
        """Cluster mode: one blocking wait per wake list, kept across idle waits."""
        self._idle = False
        self._fetch_paused = self.settings.start_paused
        self.recycled = False
        """True when the worker stopped because it reached ``max_jobs``."""
        self._closing = False
        self._running: dict[asyncio.Task[Any] | None, Job | list[Job]] = {}
        """What each runner took last (for handlers that ignore cancellation)."""
        self._waking = 0
        self._m: Recorder | None = None
        self.started_at = time.time()

    # --- control ---------------------------------------------------------------------

    def request_stop(self, fast: bool = False) -> None:
        """Begin a graceful stop (``fast``: cancel running jobs now). Thread-unsafe:
        call from the loop (signal handlers installed with ``add_signal_handler`` are)."""
        if self._stopping and not fast:
            fast = True  # a second request hurries the first
        if fast:
            self._fast = True
        if not self._stopping:
            log.info("stopping: no new jobs will be fetched")
        self._stopping = True
        self._stop_event.set()
        self._room.set()
        self._wake_runners(len(self._idle_runners))
        if fast and self._runner_tasks:
            for t in self._runner_tasks:
                t.cancel()

    async def run(self) -> int:
        """Serve until stopped. Returns the process exit code (0 on a clean stop)."""
        self._loop = asyncio.get_running_loop()
        self._stop_event = asyncio.Event()
        self._room = asyncio.Event()
        self._flush_event = asyncio.Event()
        self._runner_tasks: list[asyncio.Task[None]] = []
        s = self.settings
        self._redis = self.app.redis_settings.async_client()
        self._bredis = self.app.redis_settings.async_client(socket_timeout_s=s.max_block_s + 10)
        self._scripts = AsyncScripts(self._redis)
        if s.metrics:
            from .metrics import Recorder

            self._m = Recorder()
            self._m.set_concurrency(s.concurrency)
            served = {k.queue for k in self.queues}
            self._m.declare([(t.config.queue, name) for name, t in self._tasks.items()
                             if t.config.queue in served])
        if s.install_signal_handlers:
            self._install_signals()
        await self._startup()
        flusher = asyncio.create_task(self._flush_loop(), name="batchq-flush")
        extender = asyncio.create_task(self._extend_loop(), name="batchq-extend")
        beater = asyncio.create_task(self._heartbeat_loop(), name="batchq-heartbeat")
        metrics = asyncio.create_task(self._metrics_loop(), name="batchq-metrics")
        self._runner_tasks = [
            asyncio.create_task(self._runner(), name=f"batchq-run-{i}")
            for i in range(s.concurrency)
        ]
        try:
            await self._fetch_loop()
        finally:
            self._stopping = True
            self._wake_runners(len(self._idle_runners))
            await self._drain()
            helpers = (extender, flusher, beater, metrics)
            self._closing = True
            for t in helpers:
                t.cancel()
            # a cancel that lands inside a redis-py call can be swallowed there; never
            # let a helper loop hold the exit hostage
            _, stuck = await asyncio.wait(helpers, timeout=2.0)
            if stuck:
                log.warning("%d background tasks did not stop; leaving them", len(stuck))
            await self._flush_with_retry(final=True)
            self._publish_metrics()
            await self._close()
        return EXIT_RECYCLED if self.recycled else 0

    def _install_signals(self) -> None:
        loop = self._loop
        loop.add_signal_handler(signal.SIGTERM, self.request_stop)
        loop.add_signal_handler(signal.SIGINT, lambda: self.request_stop(fast=True))
        loop.add_signal_handler(signal.SIGQUIT, lambda: self.request_stop(fast=True))
        loop.add_signal_handler(signal.SIGTSTP, lambda: self.pause_fetching(True))
        loop.add_signal_handler(signal.SIGCONT, lambda: self.pause_fetching(False))

    def pause_fetching(self, paused: bool) -> None:
        """Stop (or resume) taking new jobs; jobs in flight keep running."""
        if paused == self._fetch_paused:
            return
        self._fetch_paused = paused
        log.info("fetching %s", "paused" if paused else "resumed")
        self._room.set()

    async def _startup(self) -> None:
        """Register the queues; a Redis that cannot be reached fails the start."""
        from .keys import queues_key

        try:
            await self._redis.sadd(queues_key(self.app.namespace),
                                   *(k.queue for k in self.queues))
        except redis.ResponseError as exc:
            # e.g. a full Redis refusing the write: the registry is informational, and a
            # worker is what drains a full Redis, so start anyway
            log.warning("could not register the queues (%s); serving them anyway", exc)
        log.info("worker %s serving %s (concurrency %d, lease %.0fs)", self.worker_id,
                 ",".join(k.queue for k in self.queues), self.settings.concurrency,
                 self.settings.lease_s)

    async def _heartbeat_loop(self) -> None:
        """Prove the loop turns: refresh the supervisor's heartbeat file every interval,
        and the worker registry in Redis (read by ``batchq info``) every few seconds."""
        s = self.settings
        path = s.heartbeat_path
        info_key = worker_info_key(self.app.namespace, self.worker_id)
        every = max(1, round(REGISTRY_EVERY_S / s.heartbeat_interval_s))
        tick = 0
        while not self._closing:
            if path:
                with contextlib.suppress(OSError):
                    os.utime(path)
            if tick % every == 0:
                with contextlib.suppress(*_REDIS_ERRORS):
                    await self._publish(info_key)
            tick += 1
            await asyncio.sleep(s.heartbeat_interval_s)

    async def _publish(self, info_key: str) -> None:
        c = self.counters
        now = time.time()
        pipe = self._redis.pipeline(transaction=False)
        pipe.zadd(workers_key(self.app.namespace), {self.worker_id: int(now * 1000)})
        pipe.hset(info_key, mapping={
            "id": self.worker_id,
            "host": os.uname().nodename,
            "pid": os.getpid(),
            "queues": ",".join(k.queue for k in self.queues),
            "concurrency": self.settings.concurrency,
            "started_at": f"{self.started_at:.3f}",
            "heartbeat_at": f"{now:.3f}",
            "succeeded": c.succeeded,
            "failed": c.failed,
            "in_flight": self._in_flight,
            "paused": int(self._fetch_paused),
        })
        pipe.expire(info_key, int(REGISTRY_EVERY_S * 6))
        await pipe.execute()

    async def _metrics_loop(self) -> None:
        while self._m is not None and not self._closing:
            await asyncio.sleep(METRICS_EVERY_S)
            self._publish_metrics()

    def _publish_metrics(self) -> None:
        if self._m is None:
            return
        queued: dict[str, int] = {}
        for item in self._work:
            q = item[0].queue if isinstance(item, list) else item.queue
            queued[q] = queued.get(q, 0) + (len(item) if isinstance(item, list) else 1)
        running = {q: len(h) - queued.get(q, 0) for q, h in self._held.items()}
        self._m.flush(running)

    async def _unpublish(self) -> None:
        with contextlib.suppress(*_REDIS_ERRORS):
            pipe = self._redis.pipeline(transaction=False)
            pipe.zrem(workers_key(self.app.namespace), self.worker_id)
            pipe.delete(worker_info_key(self.app.namespace, self.worker_id))
            await pipe.execute()

    async def _close(self) -> None:
        await self._unpublish()
        if self._blpop is not None:
            self._blpop.cancel()
            with contextlib.suppress(BaseException):
                await self._blpop
        for t in self._wake_tasks.values():
            t.cancel()
        await asyncio.gather(*self._wake_tasks.values(), return_exceptions=True)
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
        await self._redis.aclose()
        await self._bredis.aclose()

    # --- fetch -----------------------------------------------------------------------

    async def _fetch_loop(self) -> None:
        s = self.settings
        # two batches beyond the running ones: the next pop is on the wire while the
        # current batch runs, so Redis and this process work at the same time
        cap = s.concurrency + 2 * s.fetch_batch
        pause = 0.0
        while not self._stopping:
            if self._fetch_paused:
                self._room.clear()
                await self._room.wait()
                continue
            free = cap - self._in_flight
            if s.max_jobs is not None:
                free = min(free, s.max_jobs - self._jobs_done - self._in_flight)
                if free <= 0 and self._in_flight == 0:
                    log.info("max jobs (%d) reached: recycling", s.max_jobs)
                    self.recycled = True
                    self._stopping = True
                    break
            if free <= 0 or len(self._work) >= 2 * s.fetch_batch:
                self._room.clear()
                await self._room.wait()
                continue
            try:
                got, wait_s = await self._pop(free)
                pause = 0.0
            except _REDIS_ERRORS as exc:
                # a lost connection, or a server refusing (out of memory, read-only
                # replica after a failover): back off and try again, never crash
                pause = min(5.0, max(0.1, pause * 2))
                log.warning("fetch failed (%s); retrying in %.1fs", exc, pause)
                await self._sleep_unless_stopped(pause)
                continue
            if got:
                continue
            if s.burst:
                if self._in_flight == 0 and await self._queues_empty():
                    log.info("burst: queues are empty, stopping")
                    break
                # others' reservations or delayed jobs remain: look again soon
                wait_s = min(wait_s, BURST_POLL_S)
            await self._idle_wait(wait_s)

    async def _pop(self, free: int) -> tuple[int, float]:
        """Pop from every queue (rotating the order); returns (jobs got, idle wait)."""
        s = self.settings
        qs = self.queues
        n = len(qs)
        lease_ms = int(s.lease_s * 1000)
        if n == 1:
            k = qs[0]
            want = min(free, s.fetch_batch)
            t0 = time.perf_counter()
            results = [await self._scripts.pop(self._pop_keys(k), [want, lease_ms, PROMOTE_CHUNK])]
            order: tuple[QueueKeys, ...] = qs
        else:
            self._rotation = (self._rotation + 1) % n
            order = qs[self._rotation :] + qs[: self._rotation]
            share = max(1, min(s.fetch_batch, -(-free // n)))
            pipe = self._redis.pipeline(transaction=False)
            for k in order:
                want = min(share, free)
                free -= want
                await self._scripts.pop(self._pop_keys(k), [want, lease_ms, PROMOTE_CHUNK],
                                        client=pipe)
            t0 = time.perf_counter()
            results = await arun_pipeline(pipe, self._redis)
        failed = [r for r in results if isinstance(r, Exception)]
        if len(failed) == len(results):
            raise failed[0]
        m = self._m
        if m is not None:
            m.redis.observe(("pop",), time.perf_counter() - t0)
        got = 0
        wait_ms = s.max_block_s * 1000
        c = self.counters
        for k, res in zip(order, results, strict=True):
            if isinstance(res, Exception):
                # another queue's pop did run (on a cluster: another node): take its
                # jobs rather than strand them until their leases expire
                continue
            now, next_due, next_deadline, promoted, reaped, expired, malformed = res[:7]
            c.promoted += promoted
            c.reaped += reaped
            if expired or malformed or reaped:
                c.dead += expired + malformed
                if m is not None:
                    bump(m.redelivered, k.queue, reaped)
                    bump(m.dead, (k.queue, "", "lease_expired"), expired)
                    bump(m.dead, (k.queue, "", "decode_error"), malformed)
            for due in (next_due, next_deadline):
                if due >= 0:
                    wait_ms = min(wait_ms, due - now + 2)
            if len(res) > 7:
                n = self._accept(k.queue, res[7:])
                got += n
                if m is not None:
                    m.batch.observe((k.queue,), n)
        if failed:
            if not got:
                raise failed[0]
            log.warning("fetch from some queues failed (%s); retrying", failed[0])
        return got, max(0.0, wait_ms / 1000)

    def _pop_keys(self, k: QueueKeys) -> list[str]:
        return [k.delayed, k.reserved, k.inflight, k.dead, k.dead_jobs, k.wake, k.paused, *k.ready,
                k.stats]

    def _accept(self, queue: str, entries: list[bytes]) -> int:
        """Decode popped entries into the local buffer (batch tasks grouped)."""
        held = self._held[queue]
        tasks = self._tasks
        groups: dict[str, list[Job]] = {}
        n = 0
        for raw in entries:
            try:
                job = codec.decode_entry(raw, queue)
            except codec.DecodeError as exc:
                self._bury_raw(queue, raw, "decode_error", exc)
                continue
            held[job.lease] = job
            n += 1
            t = tasks.get(job.task)
            if t is not None and t.is_batch:
                g = groups.get(job.task)
                if g is None:
                    g = groups[job.task] = []
                    self._work.append(g)
                g.append(job)
                if len(g) >= (t.config.batch_size or 1):
                    del groups[job.task]
            else:
                self._work.append(job)
        self._in_flight += n
        self.counters.fetched += n
        if n and not self._waking:
            self._wake_runners(1)
        return n

    async def _idle_wait(self, wait_s: float) -> None:
        """Block until a wake token, ``wait_s`` elapses, or a stop."""
        if wait_s <= 0:
            return
        if self._blpop is None or self._blpop.done():
            keys = [k.wake for k in self.queues]
            self._blpop = asyncio.create_task(self._blpop_once(keys))
        stop = asyncio.ensure_future(self._stop_event.wait())
        self._idle = True
        try:
            await asyncio.wait((self._blpop, stop), timeout=wait_s,
                               return_when=asyncio.FIRST_COMPLETED)
        finally:
            self._idle = False
            stop.cancel()

    async def _blpop_once(self, keys: list[str]) -> None:
        if len(keys) > 1 and isinstance(self._bredis, AsyncRedisCluster):
            await self._blpop_each(keys)
            return
        try:
            res = await self._bredis.blpop(keys, timeout=self.settings.max_block_s)
        except _REDIS_ERRORS as exc:
            # any failure (a lost connection, NOPERM, a slot moving) ends this wait
            # after a pause: never a tight loop, never an unretrieved task exception
            log.warning("blocking wait failed (%s)", exc)
            await asyncio.sleep(0.5)
            return
        if res is not None and (not self._idle or self._fetch_paused or self._stopping):
            # the token arrived while this worker was busy, paused or stopping: pass it on
            # to an idle one
            with contextlib.suppress(*_REDIS_ERRORS):
                await self._redis.rpush(res[0], "1")

    async def _blpop_each(self, keys: list[str]) -> None:
        """Cluster mode: a BLPOP over keys of different slots is a CROSSSLOT error, so
        block on each wake list on its own (one task per queue, each passing on a token
        that arrives while this worker is busy, as above); return when the first one
        does. The others keep blocking, ready for the next idle wait."""
        tasks = self._wake_tasks
        for key in keys:
            t = tasks.get(key)
            if t is None or t.done():
                tasks[key] = asyncio.create_task(self._blpop_once([key]))
        try:
            await asyncio.wait(tasks.values(), return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            for t in tasks.values():
                t.cancel()
            raise

    async def _queues_empty(self) -> bool:
        pipe = self._redis.pipeline(transaction=False)
        for k in self.queues:
            for r in k.ready:
                pipe.llen(r)
            pipe.zcard(k.delayed)
            pipe.zcard(k.reserved)
        return not any(await pipe.execute())

    async def _sleep_unless_stopped(self, delay_s: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stop_event.wait(), delay_s)

    # --- run -------------------------------------------------------------------------

    def _wake_runners(self, n: int) -> None:
        """Wake up to ``n`` idle runners (all of them when stopping)."""
        idle = self._idle_runners
        while n > 0 and idle:
            fut = idle.popleft()
            if not fut.done():
                fut.set_result(None)
                self._waking += 1
                n -= 1

    async def _runner(self) -> None:
        # Runners wake each other in a chain: a runner that takes a job while more are
        # buffered wakes one idle runner, unless one is already on its way. Jobs that
        # never yield are then all run by one runner without a wake-up per job, while
        # jobs that await I/O fan out over every runner within a few loop turns.
        work = self._work
        me = asyncio.current_task()
        while True:
            if self._stopping:
                return
            if not work:
                fut = self._loop.create_future()
                self._idle_runners.append(fut)
                await fut
                self._waking -= 1
                continue
            item = work.popleft()
            if work and not self._waking:
                self._wake_runners(1)
            self._running[me] = item
            if type(item) is list:
                await self._run_batch(item)
            else:
                await self._run_one(item)  # type: ignore[arg-type]

    def _started(self, job: Job, m: Recorder) -> None:
        key = (job.queue, job.task)
        started = m.started
        started[key] = started.get(key, 0) + 1
        if job.attempt == 1:
            m.wait.observe(key, max(0.0, time.time() - job.ready_ms / 1000))

    async def _run_one(self, job: Job) -> None:
        task = self._tasks.get(job.task)
        if task is None:
            exc = LookupError(f"no task named {job.task!r} is registered")
            self._bury(job, "unknown_task", exc)
            return
        # the hot path: one coroutine per job, metrics inline (plain dict and list updates)
        m = self._m
        t0 = 0.0
        if m is not None:
            self._started(job, m)
            t0 = time.perf_counter()
        if not task.is_async:
            await self._run_sync(task, job, task.fn, *job.args, **job.kwargs)
        else:
            timeout = task.config.timeout_s
            try:
                if timeout is None:
                    await task.fn(*job.args, **job.kwargs)
                else:
                    await _with_timeout(task.fn(*job.args, **job.kwargs), timeout, job.task)
            except asyncio.CancelledError:
                self._interrupted.append(job)
                raise
            except _JobTimeout as exc:
                self._fail(job, task, exc, "timeout")
            except Exception as exc:
                self._fail(job, task, exc, "failed")
            else:
                self._ack(job)
        if m is not None:
            m.run.observe((job.queue, job.task), time.perf_counter() - t0)

    async def _run_sync(self, task: Task[..., Any], job: Job, fn: Callable[..., Any],
                        *args: Any, **kwargs: Any) -> None:
        """A plain function in the thread pool. A thread cannot be cancelled: at its
        timeout the attempt fails (retry or dead letter) and the result is discarded,
        but the runner waits for the thread before it takes another job, so at most
        ``concurrency`` threads ever run."""
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.settings.concurrency,
                                            thread_name_prefix="batchq-sync")
        fut = asyncio.wrap_future(self._pool.submit(fn, *args, **kwargs))
        timeout = task.config.timeout_s
        try:
            if timeout is None:
                await fut
            else:
                try:
                    await asyncio.wait_for(asyncio.shield(fut), timeout)
                except TimeoutError:
                    if fut.done():
                        raise
                    self._fail(job, task, _JobTimeout(
                        f"{job.task} ran longer than {timeout}s (its thread was left to "
                        "finish; the result is discarded)"), "timeout")
                    with contextlib.suppress(BaseException):
                        await fut  # hold the slot until the thread returns
                    return
        except asyncio.CancelledError:
            self._interrupted.append(job)
            raise
        except Exception as exc:
            self._fail(job, task, exc, "failed")
        else:
            self._ack(job)

    async def _run_batch(self, jobs: list[Job]) -> None:
        m = self._m
        if m is None:
            await self._run_batch_timed(jobs)
            return
        for j in jobs:
            self._started(j, m)
        t0 = time.perf_counter()
        try:
            await self._run_batch_timed(jobs)
        finally:
            elapsed = time.perf_counter() - t0
            key = (jobs[0].queue, jobs[0].task)
            for _ in jobs:
                m.run.observe(key, elapsed)

    async def _run_batch_timed(self, jobs: list[Job]) -> None:
        task = self._tasks[jobs[0].task]
        timeout = task.config.timeout_s
        try:
            if task.is_async:
                result = await _with_timeout(task.fn(jobs), timeout, f"{task.name} batch")
            else:
                if self._pool is None:
                    self._pool = ThreadPoolExecutor(self.settings.concurrency,
                                                    thread_name_prefix="batchq-sync")
                result = await self._loop.run_in_executor(self._pool, task.fn, jobs)
        except asyncio.CancelledError:
            self._interrupted.extend(jobs)
            raise
        except _JobTimeout as exc:
            for j in jobs:
                self._fail(j, task, exc, "timeout")
            return
        except Exception as exc:
            for j in jobs:
                self._fail(j, task, exc, "failed")
            return
        failures: Mapping[Any, Any] = result if isinstance(result, Mapping) else {}
        for j in jobs:
            err = failures.get(j.id)
            if err is None:
                self._ack(j)
            else:
                failure = err if isinstance(err, BaseException) else JobFailed(str(err))
                self._fail(j, task, failure, "failed")

    # --- outcomes --------------------------------------------------------------------

    def _settle(self, job: Job) -> _Buffers:
        self._held[job.queue].pop(job.lease, None)
        self._in_flight -= 1
        self._jobs_done += 1
        self._flush_event.set()
        self._room.set()
        return self._buf[job.queue]

    def _ack(self, job: Job) -> None:
        b = self._settle(job)
        b.acks.append(job.lease)
        b.ack_tasks.append(job.task)
        self.counters.succeeded += 1

    def _fail(self, job: Job, task: Task[..., Any], exc: BaseException, reason: str) -> None:
        self.counters.failed += 1
        if self._m is not None:
            bump(self._m.failed, (job.queue, job.task, reason))
        if job.attempt >= job.max_attempts:
            self._bury(job, reason, exc)
            return
        c = task.config
        if isinstance(exc, Retry) and exc.delay_s is not None:
            delay = exc.delay_s
        else:
            delay = backoff_s(c.retry_backoff_s, c.retry_backoff_max_s, job.attempt)
        log.info("job %s (%s) attempt %d/%d failed: %s: %s; retry in %.2fs", job.id, job.task,
                 job.attempt, job.max_attempts, type(exc).__name__, exc, delay)
        self._settle(job).retries.append((job.lease, int(delay * 1000), job.task))
        self.counters.retried += 1

    def _bury(self, job: Job, reason: str, exc: BaseException) -> None:
        log.warning("job %s (%s) dead-lettered: %s: %s: %s", job.id, job.task, reason,
                    type(exc).__name__, exc)
        record = codec.encode_dead_record(
            job.id, reason, job.raw, error_type=type(exc).__name__, error_message=str(exc),
            traceback="".join(traceback.format_exception(exc)),
        )
        # an unregistered name is not a metrics label: producers must not mint series
        label = job.task if job.task in self._tasks else ""
        self._settle(job).dead.append((job.lease, record, label, reason))
        self._count_dead(reason)

    def _bury_raw(self, queue: str, raw: bytes, reason: str, exc: BaseException) -> None:
        """Dead-letter an entry that is not a job (it never entered the buffer)."""
        jid, lease = codec.lease_of(raw)
        log.warning("job %s in %s dead-lettered: %s: %s", jid, queue, reason, exc)
        record = codec.encode_dead_record(jid, reason, raw, error_type=type(exc).__name__,
                                          error_message=str(exc))
        self._buf[queue].dead.append((lease, record, "", reason))
        self._flush_event.set()
        self._count_dead(reason)

    def _count_dead(self, reason: str) -> None:
        self.counters.dead += 1
        self.counters.by_reason[reason] = self.counters.by_reason.get(reason, 0) + 1

    # --- flush -----------------------------------------------------------------------

    async def _flush_loop(self) -> None:
        while not self._closing:
            await self._flush_event.wait()
            self._flush_event.clear()
            await self._flush_with_retry()

    async def _flush_with_retry(self, final: bool = False) -> None:
        pause = 0.05
        for _ in range(8 if final else 1_000_000):
            try:
                await self._flush()
                return
            except _REDIS_ERRORS as exc:
                # a full Redis (OOM) refuses writes too; acks free memory, so keep trying
                log.warning("writing results failed (%s); retrying in %.1fs", exc, pause)
                await asyncio.sleep(pause)
                pause = min(5.0, pause * 2)
        log.error("could not write results before exit; their leases will expire and the "
                  "jobs run again")

    async def _flush(self) -> None:
        todo = [(k, self._buf[k.queue]) for k in self.queues if self._buf[k.queue]]
        if not todo:
            return
        for k, _ in todo:
            self._buf[k.queue] = _Buffers()
        # (script, keys, args, queue, outcome, label of each item for the metrics)
        calls: list[tuple[AsyncScript, list[str], list[Any], str, str, list[Any]]] = []
        for k, b in todo:
            q = k.queue
            for i in range(0, len(b.acks), CHUNK):
                calls.append((self._scripts.ack, [k.reserved, k.inflight, k.stats],
                              b.acks[i : i + CHUNK],
                              q, "ok", b.ack_tasks[i : i + CHUNK]))
            nack_keys = [k.reserved, k.inflight, k.delayed, k.dead, k.dead_jobs, k.wake, k.stats]
            # nack.lua takes the retries first (their count in ARGV[1]), then the dead
            for i in range(0, len(b.retries), CHUNK):
                part = b.retries[i : i + CHUNK]
                args: list[Any] = [len(part)]
                for lease, delay, _ in part:
                    args += [lease, delay]
                calls.append((self._scripts.nack, nack_keys, args, q,
                              "retry", [t for _, _, t in part]))
            for i in range(0, len(b.dead), CHUNK):
                dead = b.dead[i : i + CHUNK]
                args = [0]
                for lease, rec, _, _ in dead:
                    args += [lease, rec]
                calls.append((self._scripts.nack, nack_keys, args, q,
                              "dead", [(t, r) for _, _, t, r in dead]))
        t0 = time.perf_counter()
        try:
            if len(calls) == 1:
                script, keys, args, _, _, _ = calls[0]
                results = [await script(keys, args)]
            else:
                pipe = self._redis.pipeline(transaction=False)
                for script, keys, args, _, _, _ in calls:
                    await script(keys, args, client=pipe)
                results = await arun_pipeline(pipe, self._redis)
                for r in results:
                    if isinstance(r, Exception):
                        raise r
        except BaseException:
            # put everything back in front of what arrived meanwhile; resending is safe
            for k, b in todo:
                b.extend(self._buf[k.queue])
                self._buf[k.queue] = b
            raise
        self._count_flushed(calls, results, time.perf_counter() - t0)

    def _count_flushed(self, calls: list[Any], results: list[Any], elapsed_s: float) -> None:
        stale_total = sum(len(r) for r in results)
        self.counters.stale_acks += stale_total
        m = self._m
        if m is None:
            return
        acks = any(c[0] is self._scripts.ack for c in calls)
        m.redis.observe(("ack" if acks else "nack",), elapsed_s)
        for (_, _, _, q, kind, labels), stale in zip(calls, results, strict=True):
            if stale:
                skip = {int(i) - 1 for i in stale}
                bump(m.stale, q, len(skip))
                labels = [lab for i, lab in enumerate(labels) if i not in skip]
            # counted per label in C (Counter), not per job in Python
            if kind == "dead":
                for (task, reason), n in collections.Counter(labels).items():
                    bump(m.dead, (q, task, reason), n)
            else:
                target = m.succeeded if kind == "ok" else m.retried
                for task, n in collections.Counter(labels).items():
                    bump(target, (q, task), n)

    # --- leases ----------------------------------------------------------------------

    async def _extend_loop(self) -> None:
        every = self.settings.lease_s / 3
        lease_ms = int(self.settings.lease_s * 1000)
        while not self._closing:
            await asyncio.sleep(every)
            for k in self.queues:
                b = self._buf[k.queue]  # results not written yet still hold their leases
                leases = [*self._held[k.queue], *b.acks, *(r[0] for r in b.retries),
                          *(d[0] for d in b.dead)]
                for i in range(0, len(leases), CHUNK):
                    part = leases[i : i + CHUNK]
                    t0 = time.perf_counter()
                    try:
                        lost = await self._scripts.extend([k.reserved], [lease_ms, *part])
                    except _REDIS_ERRORS as exc:
                        # a refusal (OOM, a migrating slot, ...) must not end this loop
                        log.warning("extending leases failed (%s)", exc)
                        break
                    if self._m is not None:
                        self._m.redis.observe(("extend",), time.perf_counter() - t0)
                    if lost:
                        self.counters.leases_lost += len(lost)
                        log.warning("%d leases in %s expired before they could be extended; "
                                    "those jobs may run twice", len(lost), k.queue)

    # --- stop ------------------------------------------------------------------------

    async def _drain(self) -> None:
        """Give back the jobs that never started at once, let running jobs finish until
        the shutdown timeout, then cancel them and give them back too."""
        await self._give_back()
        runners = [t for t in self._runner_tasks if not t.done()]
        if runners:
            timeout = 0.0 if self._fast else self.settings.shutdown_timeout_s
            pending: set[asyncio.Task[None]] = set(runners)
            if timeout > 0:
                _, pending = await asyncio.wait(runners, timeout=timeout)
            if pending:
                log.warning("shutdown timeout: cancelling %d running jobs", len(pending))
                for t in pending:
                    t.cancel()
                _, stuck = await asyncio.wait(pending, timeout=STOP_GRACE_S)
                for t in stuck:
                    # a handler that swallows cancellation: give its job back anyway;
                    # the process exits and takes the handler with it
                    job = self._running.get(t)
                    if job is not None:
                        self._interrupted.extend(job if isinstance(job, list) else [job])
                if stuck:
                    log.warning("%d jobs ignored cancellation; giving them back", len(stuck))
        await self._give_back()

    async def _give_back(self) -> None:
        """Release the buffered (never started) and interrupted jobs to ready."""
        back: dict[str, list[bytes]] = {k.queue: [] for k in self.queues}
        for item in self._work:
            for job in (item if isinstance(item, list) else [item]):
                back[job.queue].append(job.lease)
        for job in self._interrupted:
            back[job.queue].append(job.lease)
        self._work.clear()
        self._interrupted.clear()
        for k in self.queues:
            leases = back[k.queue]
            for i in range(0, len(leases), CHUNK):
                try:
                    n = await self._scripts.release([k.reserved, k.inflight, k.wake, *k.ready],
                                                    leases[i : i + CHUNK])
                    self.counters.released += int(n)
                except _REDIS_ERRORS as exc:
                    log.error("could not give back %d jobs (%s); they return when their "
                              "leases expire", len(leases), exc)
            for lease in leases:
                self._held[k.queue].pop(lease, None)


class _JobTimeout(Exception):
    """A handler ran past its task's ``timeout_s``."""


async def _with_timeout(coro: Awaitable[Any], timeout_s: float | None, what: str) -> Any:
    """Await ``coro``, cancelling it after ``timeout_s``; the expiry raises
    ``_JobTimeout``, while a ``TimeoutError`` raised by the handler itself stays one."""
    if timeout_s is None:
        return await coro
    cm = asyncio.timeout(timeout_s)
    try:
        async with cm:
            return await coro
    except TimeoutError:
        if not cm.expired():
            raise
        raise _JobTimeout(f"{what} ran longer than {timeout_s}s") from None


class JobFailed(Exception):
    """A per-job failure reported by a batch handler as a message."""


def run_worker(app: App, settings: WorkerSettings | None = None) -> int:
    """Run one worker process to completion on uvloop; returns the exit code."""
    try:
        import uvloop

        factory: Callable[[], asyncio.AbstractEventLoop] | None = uvloop.new_event_loop
    except ImportError:  # pragma: no cover - uvloop is a dependency on POSIX
        factory = None
    worker = Worker(app, settings)
    loop = factory() if factory is not None else asyncio.new_event_loop()
    try:
        return loop.run_until_complete(worker.run())
    finally:
        # cancel what is left, but never wait for ever: a handler that swallows
        # cancellation must not keep the process alive (asyncio.Runner would)
        left = [t for t in asyncio.all_tasks(loop) if not t.done()]
        for t in left:
            t.cancel()
        if left:
            loop.run_until_complete(asyncio.wait(left, timeout=STOP_GRACE_S))
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()
