"""One worker process: the stages composed on one event loop, and the stop order.

``Worker.run`` opens the shared state, starts the stages' loops (fetch, runners, flush,
extend, heartbeat/registry with the dead-letter retention, metrics, and the periodic
scheduler unless in burst mode) and, when the fetch loop ends (a stop, burst done,
recycling), stops them in this order:

1. stop fetching: the phase leaves ``RUNNING`` (``State.stop``: ``DRAINING``, or
   ``HURRYING`` for a fast stop, which also cancels the runners), an idle wait ends, idle
   runners exit; the stop event also ends the periodic scheduler, which hands its
   leadership over;
2. give back the jobs fetched but never started (``release.lua``);
3. let running jobs finish until ``shutdown_timeout_s`` (0 when hurrying), then cancel them
   and give them back too (a handler that swallows the cancellation is waited for
   ``STOP_GRACE_S``, then its job is given back anyway);
4. wait for the periodic scheduler (at most ``SCHEDULER_STOP_S``), close (``CLOSING``:
   the helper loops end), cancel the helper
   loops (waited for at most ``STOP_GRACE_S``), flush the results one last time (8
   tries), publish the metrics;
5. leave the registry, cancel the blocking wait, shut the thread pool down without
   waiting, close both clients.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import signal
from collections.abc import Callable
from typing import TYPE_CHECKING

import redis

from ..produce import periodic
from ..store import shards
from ..store.keys import QueueKeys, queues_key, shards_key
from .campaigns import FollowUp
from .exitcodes import EXIT_ERROR, EXIT_MEMORY, EXIT_RECYCLED, EXIT_USAGE
from .fetch import Fetcher
from .leases import Leases
from .memory import MIB, rss_bytes, watch
from .outcomes import Outcomes
from .phase import Phase, StopReason
from .registry import Registry
from .run import Runners
from .state import METRICS_EVERY_S, REDIS_ERRORS, STOP_GRACE_S, Counters, State, WorkerSettings

if TYPE_CHECKING:
    from ..tasks.app import App

log = logging.getLogger("batchq.worker")

SHARDS_EVERY_S = 10.0
"""How often a worker looks for shards of its queues beyond those it serves (another
process raised a queue's shard count): one ``ZMSCORE``."""

SCHEDULER_STOP_S = 3.0
"""How long a stop waits for the periodic scheduler to hand its leadership over (its
release gives up after 2 s; the lease frees the lock anyway)."""

PRELOADED_SCRIPTS = ("pop", "ack", "nack", "release", "extend", "start", "ack_result")
"""The scripts of a job's way, loaded at start (``Worker._startup``)."""


class Worker:
    """Runs the jobs of some queues in this process until stopped (or, in burst mode,
    until the queues are empty)."""

    def __init__(self, app: App, settings: WorkerSettings | None = None,
                 *, worker_id: str | None = None) -> None:
        self.app = app
        self.settings = settings or WorkerSettings()
        self.state = st = State(app, self.settings, worker_id)
        self.outcomes = Outcomes(st)
        self.leases = Leases(st)
        self.fetcher = Fetcher(st, self.outcomes)
        self.runners = Runners(st, self.outcomes, self.leases)
        self.registry = Registry(st)
        self.registry.on_orphaned = self.request_stop
        self.followup = FollowUp(st)

    @property
    def queues(self) -> tuple[QueueKeys, ...]:
        return self.state.queues

    @property
    def worker_id(self) -> str:
        return self.state.worker_id

    @property
    def counters(self) -> Counters:
        return self.state.counters

    @property
    def recycled(self) -> bool:
        """True when the worker stopped because it reached ``max_jobs``."""
        return self.state.recycled

    @property
    def over_memory(self) -> bool:
        """The RSS passed ``max_memory_mb``: the stop ends in ``EXIT_MEMORY``."""
        return self.state.reason is StopReason.MEMORY

    # --- control -----------------------------------------------------------------------

    def request_stop(self, fast: bool = False) -> None:
        """Begin a graceful stop (``fast``: cancel running jobs now). Thread-unsafe:
        call from the loop (signal handlers installed with ``add_signal_handler`` are)."""
        self._stop(StopReason.REQUESTED, fast)

    def _stop(self, reason: StopReason, fast: bool = False) -> None:
        st = self.state
        fast = fast or st.stopping  # a second request hurries the first
        if st.stop(reason, fast):
            log.info("stopping: no new jobs will be fetched")
        if fast:
            for t in st.runner_tasks:
                t.cancel()

    def pause_fetching(self, paused: bool) -> None:
        """Stop (or resume) taking new jobs; jobs in flight keep running."""
        if self.state.pause(paused) and not paused:
            log.info("fetching resumed")
        # a pause is logged by the fetch loop, once no job can be handed to this worker

    async def run(self) -> int:
        """Serve until stopped. Returns the process exit code: 0 on a clean stop (in
        burst mode: the queues are empty), ``EXIT_RECYCLED`` after ``max_jobs``,
        ``EXIT_STALLED`` for a burst run left with only paused queues holding jobs."""
        st = self.state
        s = self.settings
        await st.open()
        if s.metrics:
            from ..ops.metrics import Recorder

            st.m = Recorder()
            st.m.set_concurrency(s.concurrency)
            served = {k.queue for k in st.queues}
            st.m.declare([(t.config.queue, name) for name, t in st.tasks.items()
                          if t.config.queue in served])
        if s.install_signal_handlers:
            self._install_signals()
        await self._startup()
        helpers = [
            asyncio.create_task(self.leases.extend_loop(), name="batchq-extend"),
            asyncio.create_task(self.outcomes.flush_loop(), name="batchq-flush"),
            asyncio.create_task(self.registry.heartbeat_loop(), name="batchq-heartbeat"),
            asyncio.create_task(self._metrics_loop(), name="batchq-metrics"),
            asyncio.create_task(self.followup.loop(), name="batchq-campaigns"),
            asyncio.create_task(self._shards_loop(), name="batchq-shards"),
        ]
        if s.max_memory_mb is not None:
            helpers.append(asyncio.create_task(watch(st, s.max_memory_mb, self._over_memory),
                                               name="batchq-memory"))
        # every process runs the scheduler, one of them leads; a burst worker exits
        # when drained, so it never takes a leadership it would drop at once
        sched = None if s.burst else asyncio.create_task(
            periodic.run_scheduler(self.app, st.stop_event), name="batchq-periodic")
        if sched is not None:
            sched.add_done_callback(_scheduler_ended)
        self.runners.start()
        try:
            await self.fetcher.fetch_loop()
        finally:
            st.stop(StopReason.ENDED)  # burst done, or a failed fetch loop; else a no-op
            await self._drain()
            if sched is not None:
                # it ends by itself on the stop event, releasing the leader lock
                await asyncio.wait([sched], timeout=SCHEDULER_STOP_S)
                helpers.append(sched)
            st.close()
            for t in helpers:
                t.cancel()
            # a cancel that lands inside a redis-py call can be swallowed there; never
            # let a helper loop hold the exit hostage
            _, stuck = await asyncio.wait(helpers, timeout=STOP_GRACE_S)
            if stuck:
                log.warning("%d background tasks did not stop; leaving them", len(stuck))
            flushed = await self.outcomes.flush_with_retry(final=True)
            await self.followup.finish(flushed)  # the last flush may finish a campaign
            if self.runners.probe is not None:
                await self.runners.probe.close()  # the last load-test figures
            self._publish_metrics()
            await self._close()
        if st.reason is StopReason.MEMORY:
            return EXIT_MEMORY
        return EXIT_RECYCLED if st.reason is StopReason.RECYCLED else st.exit_code

    def _over_memory(self, rss_mb: float) -> None:
        """The memory cap's stop: the graceful stop order, as on SIGTERM."""
        self._stop(StopReason.MEMORY)

    def _install_signals(self) -> None:
        loop = self.state.loop
        loop.add_signal_handler(signal.SIGTERM, self.request_stop)
        loop.add_signal_handler(signal.SIGINT, lambda: self.request_stop(fast=True))
        loop.add_signal_handler(signal.SIGQUIT, lambda: self.request_stop(fast=True))
        loop.add_signal_handler(signal.SIGTSTP, lambda: self.pause_fetching(True))
        loop.add_signal_handler(signal.SIGCONT, lambda: self.pause_fetching(False))

    async def _startup(self) -> None:
        """Register the queues and load the scripts of a job's way; a Redis that
        cannot be reached fails the start."""
        st = self.state
        ns = self.app.namespace
        try:
            bases = list(dict.fromkeys(shards.base_of(n) for n in st.names))
            plain = [n for n in st.names if not shards.split_shard(n)[1]]
            pipe = st.redis.pipeline(transaction=False)
            pipe.sadd(queues_key(ns), *bases)
            counts = {b: n for b in bases if (n := self.app.clients.shards.count(b)) > 1}
            if counts:
                # a worker configured with shards=N announces them, so every other
                # worker serves them too (only ever raised)
                pipe.zadd(shards_key(ns), counts, gt=True)
            if plain:
                pipe.zmscore(shards_key(ns), plain)
            res = await pipe.execute(raise_on_error=False)
            if plain:
                self._serve_shards(shards.counts_of(plain, res[-1]))
            for r in res:
                if isinstance(r, redis.ResponseError):
                    raise r
        except redis.ResponseError as exc:
            # e.g. a full Redis refusing the write: the registry is informational, and a
            # worker is what drains a full Redis, so start anyway
            log.warning("could not register the queues (%s); serving them anyway", exc)
        try:
            # the scripts of a job's way, loaded before the first pop: jobs start in the
            # order popped only while no pop is re-sent after NOSCRIPT (read-ahead)
            await st.scripts.load(PRELOADED_SCRIPTS)
        except redis.ResponseError as exc:  # e.g. an ACL without script|load
            log.warning("could not load the scripts (%s); each is sent whole (EVAL) when the "
                        "server does not know it", exc)
        s = self.settings
        log.info("worker %s serving %s (concurrency %d, lease %.0fs)", st.worker_id,
                 ",".join(k.queue for k in st.queues), s.concurrency, s.lease_s)

    async def _find_shards(self) -> None:
        """Serve every shard the registry knows of (a count lowered since, or raised by
        another process): the old shards keep draining."""
        st = self.state
        plain = [n for n in st.names if not shards.split_shard(n)[1]]
        self._serve_shards(await shards.aknown(st.redis, self.app.namespace, plain))

    def _serve_shards(self, known: dict[str, int]) -> None:
        st = self.state
        subs = {n: shards.expand([n], self.app.clients.shards, known) for n in st.names}
        if st.set_shards(subs):
            self.fetcher.resize()
            log.info("serving %d sub-queues: %s", len(st.queues),
                     ",".join(k.queue for k in st.queues))

    async def _shards_loop(self) -> None:
        st = self.state
        while not st.closing:
            await st.sleep_unless_closed(SHARDS_EVERY_S)
            if st.closing:
                return
            try:
                await self._find_shards()
            except REDIS_ERRORS as exc:
                log.debug("shard registry not read (%s)", exc)

    async def _metrics_loop(self) -> None:
        """Bucket the runners' raw figures every ``FOLD_EVERY_S``, publish them to
        prometheus_client every ``METRICS_EVERY_S``."""
        from ..ops.metrics import FOLD_EVERY_S

        st = self.state
        loop = asyncio.get_running_loop()
        publish_at = loop.time() + METRICS_EVERY_S
        while st.m is not None and not st.closing:
            await st.sleep_unless_closed(min(FOLD_EVERY_S, publish_at - loop.time()))
            if loop.time() >= publish_at:
                publish_at = loop.time() + METRICS_EVERY_S
                self._publish_metrics()
            elif st.m is not None:
                st.m.fold()

    def _publish_metrics(self) -> None:
        st = self.state
        if st.m is None:
            return
        queued = st.queued_by_queue()
        st.m.flush({q: len(h) - queued.get(q, 0) for q, h in st.held.items()})

    # --- stop --------------------------------------------------------------------------

    async def _drain(self) -> None:
        """Give back the jobs that never started at once, let running jobs finish until
        the shutdown timeout, then cancel them and give them back too."""
        st = self.state
        await self.leases.give_back()
        runners = [t for t in st.runner_tasks if not t.done()]
        if runners:
            timeout = 0.0 if st.phase is Phase.HURRYING else self.settings.shutdown_timeout_s
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
                    job = st.running.get(t)
                    if job is not None:
                        st.interrupted.extend(job if isinstance(job, list) else [job])
                if stuck:
                    log.warning("%d jobs ignored cancellation; giving them back", len(stuck))
        await self.leases.give_back()

    async def _close(self) -> None:
        st = self.state
        await self.registry.unpublish()
        await self.fetcher.waiter.close()
        if st.pool is not None:
            st.pool.shutdown(wait=False, cancel_futures=True)
        await st.redis.aclose()
        await st.bredis.aclose()
        if st.app.clients.otel is not None:  # its last spans (a supervised child os._exits)
            await asyncio.to_thread(st.app.clients.otel.flush)


def _scheduler_ended(task: asyncio.Task[None]) -> None:
    """The scheduler survives Redis errors by itself: anything else ending it is a bug
    that would silently stop the periodic jobs of this process."""
    if not task.cancelled() and task.exception() is not None:
        log.error("the periodic scheduler crashed; this process no longer schedules",
                  exc_info=task.exception())


def tune_gc(threshold: int) -> None:
    """Set the first-generation threshold of the cyclic garbage collector to
    ``threshold`` (0: leave it) and freeze what exists now (imports, the app, the
    worker's own objects: they live as long as the process) out of its scans. The
    collector still runs, rarely: a handler's cyclic garbage is still freed."""
    if threshold:
        gc.freeze()
        gc.set_threshold(threshold, *gc.get_threshold()[1:])


def run_worker(app: App, settings: WorkerSettings | None = None) -> int:
    """Run one worker process to completion on uvloop; returns the exit code."""
    try:
        import uvloop

        factory: Callable[[], asyncio.AbstractEventLoop] | None = uvloop.new_event_loop
    except ImportError:  # pragma: no cover - uvloop is a dependency on POSIX
        factory = None
    worker = Worker(app, settings)
    cap_mb = worker.settings.max_memory_mb
    if cap_mb is not None and rss_bytes() >= cap_mb * MIB:
        # it would be replaced again and again without running a job
        log.error("--max-memory-per-child %d MB is below this process's RSS at start "
                  "(%.0f MB): raise it", cap_mb, rss_bytes() / MIB)
        return EXIT_USAGE
    tune_gc(worker.settings.gc_threshold)
    loop = factory() if factory is not None else asyncio.new_event_loop()
    try:
        return loop.run_until_complete(worker.run())
    except (SystemExit, KeyboardInterrupt) as exc:
        # handlers' own SystemExit / KeyboardInterrupt are caught where they run; one
        # that still gets here must not pass for a clean (exit 0) stop with jobs held
        log.error("worker stopped by %s(%s) with %d jobs in flight", type(exc).__name__,
                  exc, worker.state.in_flight)
        return EXIT_ERROR
    finally:
        # cancel what is left, but never wait for ever: a handler that swallows
        # cancellation must not keep the process alive (asyncio.Runner would)
        left = [t for t in asyncio.all_tasks(loop) if not t.done()]
        for t in left:
            t.cancel()
        if left:
            loop.run_until_complete(asyncio.wait(left, timeout=STOP_GRACE_S))
        # the app's client of this loop (the scheduler, the retention, handlers'
        # aenqueue): closed with the loop that owns it
        with contextlib.suppress(Exception):
            loop.run_until_complete(asyncio.wait_for(app.aclose(), STOP_GRACE_S))
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()
