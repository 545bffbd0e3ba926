"""Outcomes: what a finished run leaves behind, buffered and written in batches.

``ack`` / ``fail`` / ``bury`` settle a job: its lease leaves ``held`` and its result
goes to the queue's buffer; the flusher writes the buffers with ``ack.lua`` and
``nack.lua`` (1,000 per call, one pipeline for several), as soon as the loop turns
after the result was buffered. A failed write puts the buffers back in front of newer
results and is re-sent with backoff: both scripts skip leases that are already gone, so
re-sending is safe, and stale results are counted, not treated as errors.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
import traceback
from typing import TYPE_CHECKING, Any

from .. import codec
from ..codec import Job
from ..errors import RateLimited, Retry
from ..limits import group_of
from ..metrics import bump
from ..scripts import arun_pipeline, calls
from .state import CHUNK, REDIS_ERRORS, Buffers, State, backoff_s

if TYPE_CHECKING:
    from ..task import Task

log = logging.getLogger("batchq.worker")


def describe(exc: BaseException) -> str:
    """``str(exc)``, even for an exception whose ``__str__`` raises (a hostile handler
    must not break the code that reports it)."""
    try:
        return str(exc)
    except BaseException:
        return f"<{type(exc).__name__} whose str() failed>"


def _format_tb(exc: BaseException) -> str:
    try:
        return "".join(traceback.format_exception(exc))
    except BaseException:
        return ""


class Outcomes:
    """Settles jobs into the buffers and flushes them."""

    def __init__(self, state: State) -> None:
        self.st = state
        self._lock = asyncio.Lock()
        """One flush at a time: a caller that awaits ``flush`` knows that everything
        buffered before the call is written when it returns (``run`` relies on it)."""

    # --- settle ------------------------------------------------------------------------

    def settle(self, job: Job) -> Buffers:
        st = self.st
        st.held[job.queue].pop(job.lease, None)
        st.in_flight -= 1
        st.jobs_done += 1
        st.flush_event.set()
        st.room.set()
        return st.buf[job.queue]

    def ack(self, job: Job) -> None:
        b = self.settle(job)
        b.acks.append(job.lease)
        b.ack_tasks.append(job.task)
        self.st.counters.succeeded += 1

    def ack_many(self, jobs: list[Job]) -> None:
        """``ack`` each of ``jobs`` (a batch handler's successes), with the shared
        bookkeeping done once."""
        st = self.st
        held, buf = st.held, st.buf
        for job in jobs:
            held[job.queue].pop(job.lease, None)
            b = buf[job.queue]
            b.acks.append(job.lease)
            b.ack_tasks.append(job.task)
        n = len(jobs)
        st.in_flight -= n
        st.jobs_done += n
        st.counters.succeeded += n
        if n:
            st.flush_event.set()
            st.room.set()

    def succeeded(self, job: Job, task: Task[..., Any], value: Any) -> None:
        """A handler returned ``value``: ack, keeping the value when the task keeps
        results."""
        ttl_ms = task.result_ttl_ms
        if ttl_ms is None:
            self.ack(job)
        else:
            self.ack_result(job, task, value, ttl_ms)

    def ack_result(self, job: Job, task: Task[..., Any], value: Any, ttl_ms: int) -> None:
        """A success whose return value is kept (``result_ttl_s``). A value msgpack cannot
        encode, or one above ``max_payload_bytes``, fails the attempt instead."""
        try:
            data = codec.encode_result(job.task, value, self.st.app.max_payload_bytes)
        except (TypeError, ValueError) as exc:
            self.fail(job, task, exc, "failed")
            return
        b = self.settle(job)
        b.results.append((job.lease, ttl_ms, data, job.task, job.id))
        self.st.counters.succeeded += 1

    def fail(self, job: Job, task: Task[..., Any], exc: BaseException, reason: str) -> None:
        st = self.st
        if isinstance(exc, RateLimited):
            self.hold(job, exc)
            return
        st.counters.failed += 1
        if st.m is not None:
            bump(st.m.failed, (job.queue, job.task, reason))
        if job.attempt >= job.max_attempts:
            self.bury(job, reason, exc)
            return
        c = task.config
        if isinstance(exc, Retry) and exc.delay_s is not None:
            delay = exc.delay_s
        else:
            delay = backoff_s(c.retry_backoff_s, c.retry_backoff_max_s, job.attempt)
        log.info("job %s (%s) attempt %d/%d failed: %s: %s; retry in %.2fs", job.id, job.task,
                 job.attempt, job.max_attempts, type(exc).__name__, describe(exc), delay)
        self.settle(job).retries.append((job.lease, int(delay * 1000), job.task))
        st.counters.retried += 1

    def hold(self, job: Job, exc: RateLimited) -> None:
        """The provider said "too many": the job goes back to the head of its group
        with its attempt refunded, and the group (or the queue) is held in Redis. The
        jobs of that group (or queue) this process fetched but did not start go back
        with it, so none of them reaches the provider during the hold."""
        st = self.st
        group = group_of(job.id)
        log.info("job %s (%s) rate limited: its %s is held for %.1fs", job.id, job.task,
                 "group" if group else "queue", exc.retry_after_s)
        try:  # a handler may have changed the attribute to anything
            ms = round(min(max(float(exc.retry_after_s), 0.0), 86400.0) * 1000)
        except (TypeError, ValueError, OverflowError):
            ms = 1000
        back = [job]
        keep: list[Job | list[Job]] = []
        for item in st.work:
            jobs = item if isinstance(item, list) else [item]
            same = [j for j in jobs
                    if j.queue == job.queue and (not group or group_of(j.id) == group)]
            back += same
            rest = [j for j in jobs if j not in same] if same else jobs
            if rest:
                keep.append(rest if isinstance(item, list) else rest[0])
        if len(back) > 1:
            st.work.clear()
            st.work.extend(keep)
        for j in back:
            self.settle(j).holds.append((j.lease, ms, j.task))
        st.counters.held += len(back)

    def bury(self, job: Job, reason: str, exc: BaseException) -> None:
        message = describe(exc)
        log.warning("job %s (%s) dead-lettered: %s: %s: %s", job.id, job.task, reason,
                    type(exc).__name__, message)
        record = codec.encode_dead_record(
            job.id, reason, codec.counted(job.raw, job.attempt) if job.lease[:1] == b":"
            else job.raw, error_type=type(exc).__name__, error_message=message,
            traceback=_format_tb(exc),
        )
        # an unregistered name is not a metrics label: producers must not mint series
        label = job.task if job.task in self.st.tasks else ""
        self.settle(job).dead.append((job.lease, record, label, reason))
        self.count_dead(reason)

    def bury_raw(self, queue: str, raw: bytes, reason: str, exc: BaseException,
                 lease: bytes | None = None) -> None:
        """Dead-letter an entry that is not a job (it never entered ``held``); ``lease``:
        a bundle job's (its own header names the lease of any other)."""
        jid, own = codec.lease_of(raw)
        if lease is not None:  # a bundle job: its run counts an attempt (pop.lua)
            raw = codec.counted(raw, int(raw.split(b":", 2)[1]) + 1)
        lease = lease or own
        log.warning("job %r in %s dead-lettered: %s: %s", jid, queue, reason, exc)
        record = codec.encode_dead_record(jid, reason, raw, error_type=type(exc).__name__,
                                          error_message=describe(exc))
        self.st.buf[queue].dead.append((lease, record, "", reason))
        self.st.flush_event.set()
        self.count_dead(reason)

    def count_dead(self, reason: str, n: int = 1) -> None:
        c = self.st.counters
        c.dead += n
        c.by_reason[reason] = c.by_reason.get(reason, 0) + n

    # --- flush -------------------------------------------------------------------------

    async def flush_loop(self) -> None:
        st = self.st
        while not st.closing:
            await st.flush_event.wait()
            st.flush_event.clear()
            await self.flush_with_retry()

    async def flush_with_retry(self, final: bool = False) -> bool:
        """Write the buffers; retries with backoff (for ever, or 8 times when ``final``).
        Returns True once written."""
        pause = 0.05
        for _ in range(8 if final else 1_000_000):
            try:
                await self.flush()
                return True
            except REDIS_ERRORS as exc:
                # a full Redis (OOM) refuses writes too; acks free memory, so keep trying
                log.warning("writing results failed (%s); retrying in %.1fs", exc, pause)
                await asyncio.sleep(pause)
                pause = min(5.0, pause * 2)
        log.error("could not write results before exit; their leases will expire and the "
                  "jobs run again")
        return False

    async def flush(self) -> None:
        async with self._lock:
            await self._flush()

    async def _flush(self) -> None:
        st = self.st
        todo = [(k, st.buf[k.queue]) for k in st.queues if st.buf[k.queue]]
        if not todo:
            return
        for k, _ in todo:
            st.buf[k.queue] = Buffers()
        # (call, queue, outcome, label of each item for the metrics)
        batch: list[tuple[calls.Call, str, str, list[Any]]] = []
        for k, b in todo:
            q = k.queue
            for i in range(0, len(b.acks), CHUNK):
                batch.append((calls.ack(k, b.acks[i : i + CHUNK]), q, "ok",
                              b.ack_tasks[i : i + CHUNK]))
            for i in range(0, len(b.results), CHUNK):
                part_r = b.results[i : i + CHUNK]
                batch.append((calls.ack_result(k, [(lease, ttl, data)
                                                   for lease, ttl, data, _, _ in part_r],
                                               [r[4] for r in part_r]),
                              q, "ok", [r[3] for r in part_r]))
            for i in range(0, len(b.retries), CHUNK):
                part = b.retries[i : i + CHUNK]
                batch.append((calls.nack(k, retries=[(lease, d) for lease, d, _ in part]),
                              q, "retry", [t for _, _, t in part]))
            for i in range(0, len(b.dead), CHUNK):
                dead = b.dead[i : i + CHUNK]
                batch.append((calls.nack(k, dead=[(lease, rec) for lease, rec, _, _ in dead]),
                              q, "dead", [(t, r) for _, _, t, r in dead]))
            by_hold: dict[int, list[tuple[bytes, str]]] = {}
            for lease, hold_ms, task in b.holds:  # in the order the jobs were popped
                by_hold.setdefault(hold_ms, []).append((lease, task))
            for hold_ms, part_h in by_hold.items():
                batch.append((calls.release(k, [lease for lease, _ in part_h], hold_ms), q,
                              "held", [t for _, t in part_h]))
        t0 = time.perf_counter()
        try:
            if len(batch) == 1:
                results = [await st.scripts.call(batch[0][0])]
            else:
                pipe = st.redis.pipeline(transaction=False)
                for c, _, _, _ in batch:
                    await st.scripts.call(c, client=pipe)
                results = await arun_pipeline(pipe, st.redis)
                for r in results:
                    if isinstance(r, Exception):
                        raise r
        except BaseException:
            # put everything back in front of what arrived meanwhile; resending is safe
            for k, b in todo:
                b.extend(st.buf[k.queue])
                st.buf[k.queue] = b
            raise
        self._count_flushed(batch, results, time.perf_counter() - t0)

    def _count_flushed(self, batch: list[tuple[calls.Call, str, str, list[Any]]],
                       results: list[Any], elapsed_s: float) -> None:
        st = self.st
        for i, r in enumerate(results):
            if batch[i][2] == "held":  # release.lua replies how many it gave back
                results[i] = []
                continue
            if r and 0 in r:  # campaigns that became due follow a 0 (ack, ack_result, nack)
                cut = r.index(0)
                st.due_campaigns.update(x.decode() for x in r[cut + 1:])
                st.due_event.set()
                results[i] = r[:cut]
        st.counters.stale_acks += sum(len(r) for r in results)
        m = st.m
        if m is None:
            return
        acks = any(c.script in ("ack", "ack_result") for c, _, _, _ in batch)
        m.redis.observe(("ack" if acks else "nack",), elapsed_s)
        for (_, q, kind, labels), stale in zip(batch, results, strict=True):
            # declared at 0 from the start; bumped only when there is something to count
            if stale:
                skip = {int(i) - 1 for i in stale}
                bump(m.stale, q, len(skip))
                labels = [lab for i, lab in enumerate(labels) if i not in skip]
            # counted per label in C (Counter), not per job in Python
            if kind == "dead":
                for (task, reason), n in collections.Counter(labels).items():
                    bump(m.dead, (q, task, reason), n)
            elif kind == "held":
                for task, n in collections.Counter(labels).items():
                    bump(m.held, (q, task), n)
            elif labels:
                target = m.succeeded if kind == "ok" else m.retried
                if labels.count(labels[0]) == len(labels):  # one task: the usual chunk
                    bump(target, (q, labels[0]), len(labels))
                    continue
                for task, n in collections.Counter(labels).items():
                    bump(target, (q, task), n)
