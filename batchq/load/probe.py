"""The worker's side of a load run: time load jobs, keep their figures, merge them.

A ``batchq bench load`` job carries ``LOAD_KWARG = [run id, intended send time in µs]``
in its keyword arguments. The runner (``worker/run.py``) checks for it only on jobs
with keyword arguments and hands those to ``Probe.wrap``; every other job runs as
before, untouched. The wrapper takes the marker out (the handler never sees it), times
the run, and records into the process's ``Share`` of the run: run time,
enqueue-to-start and enqueue-to-done from the intended send time, and the outcome. A
handler's exception is the job's outcome, recorded by type with one example message,
and is not raised on: a load job is a measurement, so it is acknowledged rather than
retried or dead-lettered (a timeout still fails it the usual way). A handler can also
report an outcome without raising: ``batchq.current_job().record(status="429")``.

Once a second the probe merges every run's share with one ``load_merge.lua`` call per
run; the reply carries the run's status, and jobs of a run that is over (aborted, or
incomplete: its schedule could not be kept) are acknowledged without running (counted
as ``skipped``).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..store.keys import LoadKeys, load_keys
from ..tasks.context import current_job, load_var

if TYPE_CHECKING:
    from ..store.codec import Job
    from ..store.scripts import AsyncScripts
    from .merge import Share

__all__ = ["LOAD_KWARG", "CurrentJob", "Probe", "current_job"]

log = logging.getLogger("batchq.load")

LOAD_KWARG = "__batchq_load__"
"""The keyword argument that makes a job a load job: ``[run id, intended µs]``."""

MERGE_EVERY_S = 1.0


class CurrentJob:
    """A load job's recorder: ``batchq.current_job().record(...)`` (``JobContext``) hands
    its calls to the one of the load job running in this context (``load_var``), and
    does nothing outside a load run, so a task may report outcomes in production code
    too, at no cost."""

    __slots__ = ("job", "message", "run_id", "status")

    def __init__(self, job: Job | None = None, run_id: str = "") -> None:
        self.job = job
        self.run_id = run_id
        self.status = ""
        self.message = ""

    def record(self, status: str | int, message: str = "") -> None:
        """Report this run's outcome without raising: ``status`` ``"ok"`` (or ``""``)
        is a success, anything else an error of that type (e.g. an HTTP status
        ``"429"``). The last call wins; an exception raised by the handler overrides."""
        text = str(status)
        self.status = "" if text in ("", "ok") else text
        self.message = str(message)


_current = load_var  # set while a load job's handler runs


@dataclass
class _Run:
    keys: LoadKeys
    share: Share
    aborted: bool = False


def _describe(exc: BaseException) -> str:
    try:
        return str(exc)
    except BaseException:
        return f"<{type(exc).__name__} whose str() failed>"


class Probe:
    """One worker's load-run figures (thread-safe: sync handlers record from threads)."""

    def __init__(self, scripts: AsyncScripts, namespace: str,
                 stopping: Callable[[], bool]) -> None:
        self.scripts = scripts
        self.namespace = namespace
        self.stopping = stopping
        self.runs: dict[str, _Run] = {}
        self.lock = threading.Lock()
        self.task: asyncio.Task[None] | None = None
        self.merges = 0

    # --- the runner's side -------------------------------------------------------------

    def wrap(self, job: Job, fn: Callable[..., Any], is_async: bool) -> Callable[..., Any]:
        """``fn`` timed and recorded for the run named in ``job``'s marker (which is
        removed from its kwargs); ``fn`` itself when the marker is malformed."""
        marker = job.kwargs.pop(LOAD_KWARG)  # type: ignore[attr-defined]
        if type(marker) is not list or len(marker) != 2 or type(marker[0]) is not str \
                or type(marker[1]) is not int:
            log.warning("job %s has a malformed load-run marker %.80r; running it as a "
                        "plain job", job.id, marker)
            return fn
        run = self._run(marker[0])
        if run is None:
            return fn
        if self.task is None or self.task.done():
            self.task = asyncio.get_running_loop().create_task(self.merge_loop(),
                                                               name="batchq-load-merge")
        ctx = CurrentJob(job, marker[0])
        intended = marker[1] / 1e6
        if is_async:
            return functools.partial(self._arun, run, ctx, intended, fn)
        return functools.partial(self._run_sync, run, ctx, intended, fn)

    def _run(self, run_id: str) -> _Run | None:
        run = self.runs.get(run_id)
        if run is None:
            try:
                keys = load_keys(self.namespace, run_id)
            except ValueError as exc:
                log.warning("%s; running the job as a plain job", exc)
                return None
            from .merge import Share  # here: every worker imports this module

            with self.lock:
                run = self.runs.setdefault(run_id, _Run(keys, Share()))
        return run

    def _record(self, run: _Run, ctx: CurrentJob, intended: float, start: float,
                t0: float, exc: BaseException | None) -> None:
        run_s = time.perf_counter() - t0
        end = time.time()
        if exc is not None:
            error: tuple[str, str] | None = (type(exc).__name__, _describe(exc))
        elif ctx.status:
            error = (ctx.status, ctx.message)
        else:
            error = None
        with self.lock:
            run.share.record_run(intended, start, end, run_s, error)

    def _skip(self, run: _Run) -> None:
        with self.lock:
            run.share.count("skipped")

    async def _arun(self, run: _Run, ctx: CurrentJob, intended: float,
                    fn: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        if run.aborted:
            self._skip(run)
            return
        token = _current.set(ctx)
        start, t0 = time.time(), time.perf_counter()
        try:
            await fn(*args, **kwargs)
        except asyncio.CancelledError as exc:
            # a stop gives the job back (it runs again); anything else is the timeout
            if not self.stopping():
                self._record(run, ctx, intended, start, t0, TimeoutError(
                    f"cancelled after {time.perf_counter() - t0:.3f}s (timeout)"))
            raise exc
        except Exception as exc:
            self._record(run, ctx, intended, start, t0, exc)
        except BaseException as exc:
            self._record(run, ctx, intended, start, t0, exc)
            raise
        else:
            self._record(run, ctx, intended, start, t0, None)
        finally:
            _current.reset(token)

    def _run_sync(self, run: _Run, ctx: CurrentJob, intended: float,
                  fn: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        if run.aborted:
            self._skip(run)
            return
        token = _current.set(ctx)
        start, t0 = time.time(), time.perf_counter()
        try:
            fn(*args, **kwargs)
        except Exception as exc:
            self._record(run, ctx, intended, start, t0, exc)
        except BaseException as exc:
            self._record(run, ctx, intended, start, t0, exc)
            raise
        else:
            self._record(run, ctx, intended, start, t0, None)
        finally:
            _current.reset(token)

    # --- merging -----------------------------------------------------------------------

    async def merge_loop(self) -> None:
        while True:
            await asyncio.sleep(MERGE_EVERY_S)
            await self.merge()

    async def merge(self) -> None:
        """Merge every run's share (one script call per run with news)."""
        with self.lock:
            todo = [(rid, run, run.share) for rid, run in self.runs.items()
                    if not run.share.empty()]
            for _, run, share in todo:
                run.share = share.taken()
        for rid, run, share in todo:
            try:
                status = await self.scripts.call(share.call(run.keys))
                self.merges += 1
            except Exception as exc:
                log.warning("merging load run %s failed (%s); keeping its figures for the "
                            "next merge", rid, exc)
                with self.lock:
                    share.error_types_seen = run.share.error_types_seen
                    _fold(share, run.share)
                    run.share = share
                continue
            if status is None:  # the run's keys are gone: stop collecting for it
                with self.lock:
                    self.runs.pop(rid, None)
            elif status in (b"aborted", "aborted", b"incomplete", "incomplete"):
                run.aborted = True

    async def close(self) -> None:
        """Stop the merge loop and merge what is left (the worker's last step)."""
        if self.task is not None:
            self.task.cancel()
            await asyncio.gather(self.task, return_exceptions=True)
        try:
            await self.merge()
        except Exception as exc:  # never let figures hold a stopping worker
            log.warning("last load-run merge failed: %s", exc)


def _fold(into: Share, extra: Share) -> None:
    """Add ``extra`` (recorded while a failed merge was in flight) into ``into``."""
    for name, h in extra.hists.items():
        into.hists[name].merge(h)
    for k, v in extra.counts.items():
        into.count(k, v)
    for k, v in extra.errors.items():
        into.errors[k] = into.errors.get(k, 0) + v
    for k, m in extra.examples.items():
        into.examples.setdefault(k, m)
    for k, v in extra.maxima.items():
        into.maxima[k] = max(v, into.maxima.get(k, 0))
    for sec, s in extra.seconds.items():
        mine = into.second(sec)
        mine.done += s.done
        mine.errors += s.errors
        mine.sent += s.sent
        mine.run.merge(s.run)
