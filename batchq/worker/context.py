"""The worker's side of job contexts (``batchq.tasks.context``): the ``Owner`` the runners hand
to ``current_job()``, and the coalesced progress writes.

A job's progress is one string key under its queue's hash tag, ``T:progress:<id>``
(``QueueKeys.progress``), holding a small JSON record and expiring ``PROGRESS_KEEP_S``
after its last write: legal on Redis Cluster (one key, one slot), read by id alone, and
nothing to clean up (a per-queue hash would need a trim loop, and would put every
progressing job of a queue on one node). The writes are coalesced: ``JobContext``
notes each value and marks itself once; the writer sleeps ``PROGRESS_EVERY_S``, then
writes the marked ones (one pipeline), so a job is written at most once per round
whatever its handler calls, the last value winning. When a handler that reported
progress returns (or raises), the runner writes its last value with the end time
(``finish``) before the job's outcome is settled, so a reader that sees the job
finished also sees its last progress, and a job shorter than a round is written once.
A progress write that fails is logged and dropped: progress is informational, never a
reason to fail or delay a job further.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from typing import TYPE_CHECKING, Any

from ..store.keys import QueueKeys
from ..tasks.context import PROGRESS_EVERY_S, JobContext
from .state import REDIS_ERRORS

if TYPE_CHECKING:
    from ..store.codec import Job
    from .state import State

log = logging.getLogger("batchq.worker")

PROGRESS_KEEP_S = 86400.0
"""How long a job's progress record is kept after its last write."""


class Owner:
    """One worker process's job contexts and their progress writes."""

    def __init__(self, state: State) -> None:
        self.st = state
        self.live: dict[bytes, JobContext] = {}
        """Contexts made by ``current_job()`` for jobs that run now, by lease."""
        self._dirty: dict[JobContext, None] = {}
        self._lock = threading.Lock()  # sync handlers mark from the pool's threads
        self._flushing = False
        self._task: asyncio.Task[None] | None = None
        self._wlock: asyncio.Lock | None = None
        self._loop_thread = -1
        self.writes = 0
        """Progress records written (one SET each)."""

    def start(self) -> None:
        """On the worker's loop, before the first job."""
        self._loop_thread = threading.get_ident()

    # --- ContextOwner ------------------------------------------------------------------

    def keys(self, queue: str) -> QueueKeys:
        k = self.st.by_name.get(queue)
        return k if k is not None else self.st.app.keys(queue)

    def sync_redis(self) -> Any:
        return self.st.app.redis

    def mark(self, ctx: JobContext) -> None:
        """``ctx`` has a value to write (from any thread)."""
        with self._lock:
            self._dirty[ctx] = None
            if self._flushing:
                return
            self._flushing = True
        if threading.get_ident() == self._loop_thread:
            self._start()
        else:
            self.st.loop.call_soon_threadsafe(self._start)

    # --- writes ------------------------------------------------------------------------

    def _start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._flush_loop(),
                                                            name="batchq-progress")

    async def _flush_loop(self) -> None:
        try:
            while True:
                # trailing: a job shorter than a round writes once, at its end (finish)
                await asyncio.sleep(PROGRESS_EVERY_S)
                with self._lock:
                    batch = list(self._dirty)
                    self._dirty.clear()
                    if not batch:
                        self._flushing = False
                        return
                await self._write(batch)
        except BaseException:
            with self._lock:
                self._flushing = False
            raise

    async def finish(self, item: Job | list[Job]) -> None:
        """``item``'s handler is over: its contexts end, and a value not written yet is
        written now (before the outcome is settled)."""
        jobs: list[Job] = item if isinstance(item, list) else [item]
        final = []
        for job in jobs:
            ctx = self.live.pop(job.lease, None)
            if ctx is None:
                continue
            ctx.end()
            with self._lock:
                self._dirty.pop(ctx, None)
            if ctx.progress_value is not None:  # the last value, and when the run ended
                final.append(ctx)
        if final:
            await self._write(final, end=True)

    async def _write(self, ctxs: list[JobContext], end: bool = False) -> None:
        if self._wlock is None:
            self._wlock = asyncio.Lock()
        # one write at a time: what reaches Redis last was taken last
        async with self._wlock:
            now_ms = round(time.time() * 1000)
            keep_ms = round(PROGRESS_KEEP_S * 1000)
            pipe = self.st.redis.pipeline(transaction=False)
            for ctx in ctxs:
                value, message = ctx.take()
                rec: dict[str, Any] = {"v": value, "m": message, "a": ctx.attempt,
                                       "at": now_ms, "st": ctx.started_ms}
                if end:
                    rec["end"] = now_ms
                pipe.set(self.keys(ctx._job.queue).progress(ctx.id),
                         json.dumps(rec, separators=(",", ":"), ensure_ascii=False),
                         px=keep_ms)
            try:
                await pipe.execute()
                self.writes += len(ctxs)
            except REDIS_ERRORS as exc:
                log.warning("writing the progress of %d jobs failed (%s); dropped",
                            len(ctxs), exc)
