"""Running: up to ``concurrency`` runner coroutines take jobs from ``state.work`` and run
them. Runners are made as jobs arrive (``State.wake_runners``), so a process holds as
many as it ever had jobs to run at once, not one per slot.

Async handlers run inline, plain functions in a thread pool of ``concurrency`` threads,
batch handlers with a list of jobs. Every run ends in exactly one outcome (ack, retry
or dead letter) whatever the handler does:

* ``Exception``: the attempt failed (``timeout`` when ``timeout_s`` expired);
* any other ``BaseException`` raised by the handler (``GeneratorExit``, a custom
  subclass, ``KeyboardInterrupt``, ``SystemExit`` including ``sys.exit(0)``, a
  ``CancelledError`` nobody asked for): the attempt failed too, and the runner keeps
  serving. A handler cannot stop the worker (stop it with a signal): a burst run still
  ends only when its queues are empty;
* a cancellation of the runner (a stop): the job is given back (``release.lua``).

A job that dead workers held repeatedly (pop.lua's crash marks flag it, "recovered")
runs alone: no other handler runs in this process from the moment its start is
recorded (``start.lua``) until its outcome is written, so if the process dies, that job
is the suspect and its neighbours get their attempt back.

Runners wake each other in a chain: a runner that takes a job while more are buffered
wakes one idle runner, unless one is already on its way. Jobs that never yield are then
all run by one runner without a wake-up per job, while jobs that await I/O fan out over
every runner within a few loop turns. A runner that ran for ``YIELD_EVERY_S`` without
yielding yields once, so finished jobs' acks are written within that bound.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any

from ..load.probe import LOAD_KWARG, Probe
from ..store.codec import Job
from ..tasks.context import RunnerSlot, job_var, slot_var
from .context import Owner
from .leases import Leases
from .outcomes import Outcomes, describe
from .phase import Phase
from .state import RUN_SAMPLE_MASK, YIELD_EVERY_S, State

_RUNNING, _DRAINING = Phase.RUNNING, Phase.DRAINING  # module globals: read per job

if TYPE_CHECKING:
    from ..ops.metrics import JobSeries
    from ..tasks.task import Task

log = logging.getLogger("batchq.worker")

_perf = time.perf_counter
_now = time.time


class JobFailed(Exception):
    """A per-job failure reported by a batch handler as a message."""


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


def _we_are_cancelled() -> bool:
    """True when the running task was cancelled (a stop), False when a handler raised
    ``CancelledError`` on its own."""
    me = asyncio.current_task()
    return me is not None and me.cancelling() > 0


class Runners:
    def __init__(self, state: State, outcomes: Outcomes, leases: Leases) -> None:
        self.st = state
        self.out = outcomes
        self.leases = leases
        self.probe: Probe | None = None
        """Load-test figures (``batchq.load.probe``), made on the first load job."""
        self.ctx = Owner(state)
        """Job contexts (``batchq.current_job()``) and their progress writes."""

    def start(self) -> None:
        """From now on ``State.wake_runners`` makes runners when too few are idle."""
        st = self.st
        self.ctx.start()
        st.runner_tasks = []
        st.spawn_runner = lambda: asyncio.create_task(
            self.runner(), name=f"batchq-run-{len(st.runner_tasks)}")
        if st.work:
            st.wake_runners(1)

    async def runner(self) -> None:
        st = self.st
        work = st.work
        loop = st.loop
        me = asyncio.current_task()
        st.waking -= 1  # made by wake_runners, counted as woken until here
        # the job context (batchq.tasks.context): the runner once, then one set per job
        slot = RunnerSlot(self.ctx, _now() - _perf())
        slot_var.set(slot)
        # the runner's clock, read once between two items: the end of one is the start of
        # the next unless the runner awaits in between (then it reads the clock again),
        # so the metrics time each job without reading a clock of their own
        t = last_yield = _perf()
        while True:
            # State.phase's own attribute: the property costs a call per job
            if st._phase is not _RUNNING or not work:
                if st._phase >= _DRAINING:
                    return
                # nothing to run, or a recovered job runs alone (Phase.ALONE)
                fut = loop.create_future()
                st.idle_runners.append(fut)
                await fut
                st.waking -= 1
                t = last_yield = _perf()
                continue
            item = work.popleft()
            if work and not st.waking:
                st.wake_runners(1)
            st.running[me] = item
            slot.item, slot.t0 = item, t
            # no reset after the job: the next one replaces it, and the runner runs no
            # user code in between (a reset would cost a job as much again)
            job_var.set(item)
            ser = None
            # the hot path awaits the handler two frames down (runner, _run_one): the
            # busy count and the run-time sample are kept here, not in a coroutine
            one = type(item) is not list
            try:
                if item.recovered if one else any(j.recovered for j in item):  # type: ignore
                    await self._run_alone(item)
                else:
                    timed = self._begin()
                    try:
                        if one:
                            ser = await self._run_one(item, t)  # type: ignore[arg-type]
                        else:
                            await self._run_batch(item)  # type: ignore[arg-type]
                    finally:
                        self._end(item, t, timed)
            except asyncio.CancelledError:
                raise
            except BaseException as exc:
                log.exception("internal error running %s; failing what is unsettled", item)
                self._settle_leftovers([item] if one else item, exc)  # type: ignore
            now = _perf()
            if ser is not None:
                ser.runs.append(now - t)
            t = now
            if now - last_yield > YIELD_EVERY_S:
                await asyncio.sleep(0)  # let the flusher write what finished
                t = last_yield = _perf()

    def _begin(self) -> bool:
        """A job or a batch starts (counted as busy). True when its wall time is to be
        sampled: it sizes the prefetch (fetch_size.Sizing.limit); timed for a sample of jobs
        only (the first ones included): timing each would cost a no-op job ~4 %."""
        st = self.st
        if not st.busy:
            st.quiet.clear()
        st.busy += 1
        return not st.jobs_done & RUN_SAMPLE_MASK

    def _end(self, item: Job | list[Job], t0: float, timed: bool) -> None:
        """The job or batch ``_begin`` counted, started at ``t0``, is over."""
        st = self.st
        st.busy -= 1
        if not st.busy:
            st.quiet.set()
        if timed:
            st.note_run(_perf() - t0, len(item) if type(item) is list else 1)

    async def _run_alone(self, item: Job | list[Job]) -> None:
        """A recovered job: wait until no other handler runs, record its start, run it,
        and write its outcome before another handler may start."""
        st = self.st
        jobs: list[Job] = item if type(item) is list else [item]  # type: ignore[list-item]
        st.run_alone()
        try:
            try:
                await st.quiet.wait()
                started = await self.leases.mark_started(jobs)
            except asyncio.CancelledError:
                st.interrupted.extend(jobs)
                raise
            if not started:
                st.interrupted.extend(jobs)
                return
            log.info("running recovered job %s alone (an earlier worker died holding it)",
                     ", ".join(j.id for j in jobs))
            t0 = _perf()
            timed = self._begin()
            try:
                if type(item) is list:
                    await self._run_batch(item)
                else:
                    ser = await self._run_one(item, t0)  # type: ignore[arg-type]
                    if ser is not None:
                        ser.runs.append(_perf() - t0)
            finally:
                self._end(item, t0, timed)
            # its outcome (and the started mark it clears) is written before any other
            # handler starts: a crash of a later job must not be charged to this one
            await self.out.flush_with_retry()
        finally:
            st.end_alone()
            st.wake_runners(len(st.work))

    def _settle_leftovers(self, jobs: list[Job], exc: BaseException) -> None:
        st = self.st
        for job in jobs:
            if job.lease not in st.held[job.queue] or job in st.interrupted:
                continue
            task = st.tasks.get(job.task)
            if task is None:
                self.out.bury(job, "failed", exc)
            else:
                self.out.fail(job, task, exc, "failed")

    def _handler_raised(self, job: Job, task: Task[..., Any], exc: BaseException) -> None:
        """A handler raised a BaseException that is not an Exception."""
        if isinstance(exc, SystemExit | KeyboardInterrupt):
            log.error("the handler of job %s (%s) raised %s(%s): a handler cannot stop the "
                      "worker; the attempt counts as failed", job.id, job.task,
                      type(exc).__name__, describe(exc))
        self.out.fail(job, task, exc, "failed")

    async def _run_one(self, job: Job, t0: float) -> JobSeries | None:
        """Run one job started at ``t0``; returns its metrics series (the caller appends
        the run time), None with metrics off."""
        st = self.st
        task = st.tasks.get(job.task)
        if task is None:
            exc = LookupError(f"no task named {job.task!r} is registered")
            self.out.bury(job, "unknown_task", exc)
            return None
        if task.config.breaker is not None and not self.out.gate.clear(task) \
                and await self.out.gate.check(job, task):
            return None  # its circuit breaker is open: held, or re-routed to a fallback
        # the hot path: one coroutine per job, metrics inline (a counter and an append;
        # no clock of their own: t0 is the runner's)
        m = st.m
        ser = None
        if m is not None:  # a start counted: a first attempt's wait, or a restart
            q = m.by_queue.get(job.queue)
            ser = q.get(job.task) if q is not None else None
            if ser is None:
                ser = m.series_of(job.queue, job.task)
            if job.attempt == 1:
                ser.waits.append(t0 + m.wall_offset - job.ready_ms / 1000)
            else:
                ser.restarts += 1
        fn = task.fn
        if job.kwargs and LOAD_KWARG in job.kwargs:  # a `batchq bench load` job
            fn = self._load_probe().wrap(job, fn, task.is_async)
        if st.app.clients.otel is not None:  # traced (batchq.ops.otel): a span around the run
            fn = st.app.clients.otel.wrap(job, fn, task.is_async)
        if not task.is_async:
            await self._run_sync(task, job, fn, *job.args, **job.kwargs)
        else:
            timeout = task.config.timeout_s if job.timeout_s is None else job.timeout_s
            try:
                try:
                    if timeout is None:
                        value = await fn(*job.args, **job.kwargs)
                    else:
                        value = await _with_timeout(fn(*job.args, **job.kwargs), timeout,
                                                    job.task)
                finally:
                    if self.ctx.live:  # its last progress, before its outcome
                        await self.ctx.finish(job)
            except asyncio.CancelledError as exc:
                if _we_are_cancelled():
                    st.interrupted.append(job)
                    raise
                self._handler_raised(job, task, exc)
            except _JobTimeout as exc:
                self.out.fail(job, task, exc, "timeout")
            except Exception as exc:
                self.out.fail(job, task, exc, "failed")
            except BaseException as exc:
                self._handler_raised(job, task, exc)
            else:
                self.out.succeeded(job, task, value)
        return ser

    def _load_probe(self) -> Probe:
        if self.probe is None:
            st = self.st
            self.probe = Probe(st.scripts, st.app.namespace, lambda: st.stopping)
        return self.probe

    async def _run_sync(self, task: Task[..., Any], job: Job, fn: Callable[..., Any],
                        *args: Any, **kwargs: Any) -> None:
        """A plain function in the thread pool. A thread cannot be cancelled: at its
        timeout the attempt fails (retry or dead letter) and the result is discarded,
        but the runner waits for the thread before it takes another job, so at most
        ``concurrency`` threads ever run."""
        # the thread runs in a copy of this context: current_job() is this job there
        fut = asyncio.wrap_future(self.st.thread_pool().submit(
            contextvars.copy_context().run, fn, *args, **kwargs))
        timeout = task.config.timeout_s if job.timeout_s is None else job.timeout_s
        try:
            if timeout is None:
                try:
                    value = await fut
                finally:
                    if self.ctx.live:
                        await self.ctx.finish(job)
            else:
                try:
                    try:
                        value = await asyncio.wait_for(asyncio.shield(fut), timeout)
                    finally:
                        if self.ctx.live:
                            await self.ctx.finish(job)
                except TimeoutError:
                    if fut.done():
                        raise
                    self.out.fail(job, task, _JobTimeout(
                        f"{job.task} ran longer than {timeout}s (its thread was left to "
                        "finish; the result is discarded)"), "timeout")
                    with contextlib.suppress(BaseException):
                        await fut  # hold the slot until the thread returns
                    return
        except asyncio.CancelledError as exc:
            if _we_are_cancelled():
                self.st.interrupted.append(job)
                raise
            self._handler_raised(job, task, exc)
        except Exception as exc:
            self.out.fail(job, task, exc, "failed")
        except BaseException as exc:
            self._handler_raised(job, task, exc)
        else:
            self.out.succeeded(job, task, value)

    async def _run_batch(self, jobs: list[Job]) -> None:
        m = self.st.m
        if m is None:
            await self._run_batch_timed(jobs)
            return
        # one (queue, task) per batch: accept groups a fetch's jobs by task
        ser = m.series_of(jobs[0].queue, jobs[0].task)
        now = _now()
        waits = [now - j.ready_ms / 1000 for j in jobs if j.attempt == 1]
        ser.waits += waits
        ser.restarts += len(jobs) - len(waits)
        t0 = _perf()
        try:
            await self._run_batch_timed(jobs)
        finally:
            ser.runs += [_perf() - t0] * len(jobs)

    async def _run_batch_timed(self, jobs: list[Job]) -> None:
        st = self.st
        task = st.tasks[jobs[0].task]
        fn = task.fn if st.app.clients.otel is None else \
            st.app.clients.otel.wrap_batch(jobs, task.fn, task.is_async)  # traced (batchq.ops.otel)
        timeout = task.config.timeout_s
        try:
            try:
                if task.is_async:
                    result = await _with_timeout(fn(jobs), timeout, f"{task.name} batch")
                else:
                    result = await st.loop.run_in_executor(
                        st.thread_pool(), contextvars.copy_context().run, fn, jobs)
            finally:
                if self.ctx.live:  # the jobs' last progress, before their outcomes
                    await self.ctx.finish(jobs)
        except asyncio.CancelledError as exc:
            if _we_are_cancelled():
                st.interrupted.extend(jobs)
                raise
            for j in jobs:
                self._handler_raised(j, task, exc)
            return
        except _JobTimeout as exc:
            for j in jobs:
                self.out.fail(j, task, exc, "timeout")
            return
        except Exception as exc:
            for j in jobs:
                self.out.fail(j, task, exc, "failed")
            return
        except BaseException as exc:
            for j in jobs:
                self._handler_raised(j, task, exc)
            return
        try:
            failures: Mapping[Any, Any] = result if isinstance(result, Mapping) else {}
            errors = [failures.get(j.id) for j in jobs]
        except Exception as exc:  # a hostile mapping: nothing it says can be trusted
            for j in jobs:
                self.out.fail(j, task, exc, "failed")
            return
        if not any(e is not None for e in errors):  # the usual case: all succeeded
            self.out.ack_many(jobs)
            return
        for j, err in zip(jobs, errors, strict=True):
            if err is None:
                self.out.ack(j)
            else:
                failure = err if isinstance(err, BaseException) else JobFailed(describe_value(err))
                self.out.fail(j, task, failure, "failed")


def describe_value(value: Any) -> str:
    """``str(value)`` of what a batch handler reported, even a hostile object."""
    try:
        return str(value)
    except Exception:
        return f"<{type(value).__name__} whose str() failed>"
