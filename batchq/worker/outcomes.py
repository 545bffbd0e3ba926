"""Outcomes: what a finished run leaves behind, buffered and written in batches.

``ack`` / ``fail`` / ``bury`` settle a job: its lease leaves ``held`` and its result
goes to the queue's buffer; the flusher writes the buffers with ``ack.lua`` and
``nack.lua`` (1,000 per call, one pipeline for several), as soon as the loop turns
after the result was buffered. A failed write puts the buffers back in front of newer
results and is re-sent with backoff: both scripts skip leases that are already gone, so
re-sending is safe, and stale results are counted, not treated as errors. A call Redis
refuses for what it carries (``refused``: an error it would give again, not a full or
moving server) is never re-sent as it was: a result it cannot keep ends its job dead as
``result_refused``.

A handler's ``RateLimited`` is bounded here (``hold_bounds``): at least ``MIN_HOLD_S``,
at most the task's ``max_hold_s``, ``DEFAULT_HOLD_S`` when it carries no usable value,
and after the task's ``max_refunds`` refunded runs of a job in a row the next counts.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import math
import shlex
import time
import traceback
from typing import TYPE_CHECKING, Any

import redis

from ..flow.breaker import BreakerOpen
from ..flow.limits import group_name, group_of
from ..ops.metrics import bump
from ..store import codec, replicas
from ..store.codec import Job
from ..store.keys import QueueKeys
from ..store.scripts import arun_pipeline, calls
from ..tasks.durations import MAX_DURATION_S
from ..tasks.errors import DEFAULT_HOLD_S, MIN_HOLD_S, RateLimited, Retry
from .breakers import Gate
from .state import CHUNK, REDIS_ERRORS, Buffers, State, backoff_s

if TYPE_CHECKING:
    from ..tasks.task import Task

log = logging.getLogger("batchq.worker")


_TRANSIENT = (redis.exceptions.OutOfMemoryError, redis.exceptions.ReadOnlyError,
              redis.exceptions.NoScriptError, redis.exceptions.NoPermissionError,
              redis.exceptions.TryAgainError, redis.exceptions.ClusterDownError,
              redis.exceptions.MovedError, redis.exceptions.AskError,
              redis.exceptions.MasterDownError)
_TRANSIENT_CODES = ("BUSY", "LOADING", "NOREPLICAS", "OOM", "READONLY", "MASTERDOWN",
                    "TRYAGAIN", "CLUSTERDOWN", "NOPERM", "UNKILLABLE")


def refused(exc: BaseException) -> bool:
    """An error reply Redis would give again to the same call (a value it cannot take),
    unlike a full, read-only, loading, busy or moving server, or a lost connection: a
    flush re-sends those for ever, never these."""
    return isinstance(exc, redis.ResponseError) and not isinstance(exc, _TRANSIENT) \
        and not str(exc).startswith(_TRANSIENT_CODES)


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


REFUNDS_KEPT = 10_000
"""Jobs whose refunded ``RateLimited`` runs a worker process counts at once."""


def _number(value: object) -> float:
    """``value`` as a float; nan for anything that is not a number."""
    try:
        return float(value)  # type: ignore[arg-type]
    except BaseException:  # a hostile __float__
        return math.nan


def hold_bounds(exc: BaseException, max_hold_s: float) -> tuple[float, str]:
    """The hold ``exc`` (a ``RateLimited``) asks for, in seconds, within
    ``MIN_HOLD_S..max_hold_s``, and a note for the log when it was not taken as asked. A
    subclass that never set ``retry_after_s``, or a value changed to nan, a string or a
    negative number, holds ``DEFAULT_HOLD_S``."""
    try:
        asked = _number(getattr(exc, "retry_after_s", None))
    except BaseException:  # a property that raises
        asked = math.nan
    if not math.isfinite(asked) or asked < 0:
        try:
            raw = repr(getattr(exc, "retry_after_s", "<missing>"))[:40]
        except BaseException:
            raw = "<unreadable>"
        return min(DEFAULT_HOLD_S, max_hold_s), \
            f" (retry_after_s {raw} is not a number of seconds: the default hold)"
    if asked > max_hold_s:
        return max_hold_s, f" (asked {asked:g}s; the task's max_hold_s is {max_hold_s:g}s)"
    if asked < MIN_HOLD_S:
        return MIN_HOLD_S, f" (asked {asked:g}s; the shortest hold is {MIN_HOLD_S:g}s)"
    return asked, ""


def retry_delay_s(exc: Retry) -> float | None:
    """A ``Retry``'s ``delay_s`` if it is a usable number of seconds (it may have been
    changed after construction), else None: the task's backoff."""
    try:
        raw = getattr(exc, "delay_s", None)
    except BaseException:
        return None
    if raw is None:
        return None
    d = _number(raw)
    return d if math.isfinite(d) and 0 <= d <= MAX_DURATION_S else None


class Outcomes:
    """Settles jobs into the buffers and flushes them."""

    def __init__(self, state: State) -> None:
        self.st = state
        self._lock = asyncio.Lock()
        """One flush at a time: a caller that awaits ``flush`` knows that everything
        buffered before the call is written when it returns (``run`` relies on it)."""
        self._result_jobs: dict[bytes, Job] = {}
        """Lease -> job of each result buffered and not yet written (a result Redis
        refuses dead-letters its job: the record needs the entry)."""
        self._solo: set[bytes] = set()
        """Leases of results to send one per call (their call was refused)."""
        self._refunds: dict[str, int] = {}
        """Job id -> its ``RateLimited`` runs in a row with the attempt refunded, in this
        process (at most ``REFUNDS_KEPT``, the oldest forgotten first)."""
        self.gate = Gate(state, self)  # jobs of open circuit breakers (breakers.py)

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
        self._result_jobs[job.lease] = job
        self.st.counters.succeeded += 1

    def fail(self, job: Job, task: Task[..., Any], exc: BaseException, reason: str) -> None:
        st = self.st
        delay: float | None = None
        if isinstance(exc, BreakerOpen):  # refused before it reached the provider
            self.gate.refused(job, task, exc)
            return
        if isinstance(exc, RateLimited):
            delay = self.hold(job, task, exc)
            if delay is None:
                return
            reason = "rate_limited"  # its refunds are used up: this run counts
        st.counters.failed += 1
        if st.m is not None:
            bump(st.m.failed, (job.queue, job.task, reason))
        if job.attempt >= job.max_attempts:
            self.bury(job, reason, exc)
            return
        c = task.config
        if isinstance(exc, Retry):
            delay = retry_delay_s(exc)
        if delay is None:
            delay = backoff_s(c.retry_backoff_s, c.retry_backoff_max_s, job.attempt)
        log.info("job %s (%s) attempt %d/%d failed: %s: %s; retry in %.2fs", job.id, job.task,
                 job.attempt, job.max_attempts, type(exc).__name__, describe(exc), delay)
        self.settle(job).retries.append((job.lease, int(delay * 1000), job.task,
                                         f"{type(exc).__name__}: {describe(exc)}"))
        st.counters.retried += 1

    def hold(self, job: Job, task: Task[..., Any], exc: RateLimited) -> float | None:
        """The provider said "too many": the job goes back to the head of its group
        with its attempt refunded, and the group (or the queue) is held in Redis. The
        jobs of that group (or queue) this process fetched but did not start go back
        with it, so none of them reaches the provider during the hold.

        The hold is bounded (``hold_bounds``); after the task's ``max_refunds`` such runs
        of one job in a row, nothing is held and the hold in seconds is returned: this
        run counts as a failed attempt, retried after it. None when held."""
        st = self.st
        c = task.config
        hold_s, why = hold_bounds(exc, c.max_hold_s)
        n = self._refunds.pop(job.id, 0) + 1
        if n > c.max_refunds:
            log.warning("job %s (%s) rate limited %d times in a row (max_refunds=%d): "
                        "attempt %d/%d counts", job.id, job.task, n, c.max_refunds,
                        job.attempt, job.max_attempts)
            return hold_s
        self._refunds[job.id] = n
        if len(self._refunds) > REFUNDS_KEPT:
            del self._refunds[next(iter(self._refunds))]
        ms = round(hold_s * 1000)
        group = group_of(job.id)
        what = f"group {group_name(group)!r} of queue {job.queue!r}" if group \
            else f"queue {job.queue!r}"
        release = f"batchq release MODULE:APP {shlex.quote(job.queue)}" + (
            f" --group {shlex.quote(group_name(group))}" if group else "")
        log.info("job %s (%s) rate limited: its %s is held for %.1fs%s; to end the hold "
                 "early: %s", job.id, job.task, what, hold_s, why, release)
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
        return None

    def bury(self, job: Job, reason: str, exc: BaseException) -> None:
        self._bury(job, reason, exc, self.settle(job))

    def bury_settled(self, job: Job, reason: str, exc: BaseException) -> None:
        """``bury`` a job already settled as a success whose ack Redis refused."""
        self.st.counters.succeeded -= 1
        self._bury(job, reason, exc, self.st.buf[job.queue])
        self.st.flush_event.set()

    def _bury(self, job: Job, reason: str, exc: BaseException, b: Buffers) -> None:
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
        b.dead.append((job.lease, record, label, reason))
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
        kept: dict[int, tuple[QueueKeys, list[Any]]] = {}  # batch index -> results sent
        for k, b in todo:
            q = k.queue
            for i in range(0, len(b.acks), CHUNK):
                batch.append((calls.ack(k, b.acks[i : i + CHUNK]), q, "ok",
                              b.ack_tasks[i : i + CHUNK]))
            solo = self._solo
            chunks = [[r] for r in b.results if r[0] in solo] if solo else []
            rest = [r for r in b.results if r[0] not in solo] if solo else b.results
            chunks += [rest[i : i + CHUNK] for i in range(0, len(rest), CHUNK)]
            for part_r in chunks:
                kept[len(batch)] = (k, part_r)
                batch.append((calls.ack_result(k, [(lease, ttl, data)
                                                   for lease, ttl, data, _, _ in part_r],
                                               [r[4] for r in part_r]),
                              q, "ok", [r[3] for r in part_r]))
            for i in range(0, len(b.retries), CHUNK):
                part = b.retries[i : i + CHUNK]
                batch.append((calls.nack(k, retries=[(ls, d, e) for ls, d, _, e in part]),
                              q, "retry", [t for _, _, t, _ in part]))
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
            d = st.app.clients.durability
            if d.min_replicas:  # the flush and one WAIT on its connection (replicas.py)
                results, acked = await replicas.run_async(st.redis, [
                    (st.scripts.by_name[c.script], c.keys, c.args) for c, _, _, _ in batch], d)
                replicas.warn_short(d, acked, "acks")
                for r in results:
                    if isinstance(r, Exception) and not refused(r):
                        raise r
            elif len(batch) == 1:
                try:
                    results = [await st.scripts.call(batch[0][0])]
                except redis.ResponseError as exc:
                    if not refused(exc):
                        raise
                    results = [exc]
            else:
                pipe = st.redis.pipeline(transaction=False)
                for c, _, _, _ in batch:
                    await st.scripts.call(c, client=pipe)
                results = await arun_pipeline(pipe, st.redis)
                for r in results:
                    if isinstance(r, Exception) and not refused(r):
                        raise r
        except BaseException:
            # put everything back in front of what arrived meanwhile; resending is safe
            for k, b in todo:
                b.extend(st.buf[k.queue])
                st.buf[k.queue] = b
            raise
        elapsed_s = time.perf_counter() - t0
        bad = {i for i, r in enumerate(results) if isinstance(r, Exception)}
        for i, (_, part) in kept.items():
            if i not in bad:  # written (or stale): forgotten
                for r in part:
                    self._result_jobs.pop(r[0], None)
                    self._solo.discard(r[0])
        if bad:
            # sent again, the same call gets the same refusal: never retried as a whole
            for i in sorted(bad):
                self._refused_call(batch[i], results[i], kept.get(i))
            batch = [c for i, c in enumerate(batch) if i not in bad]
            results = [r for i, r in enumerate(results) if i not in bad]
        self._count_flushed(batch, results, elapsed_s)

    def _refused_call(self, entry: tuple[calls.Call, str, str, list[Any]],
                      exc: BaseException, sent: tuple[QueueKeys, list[Any]] | None) -> None:
        """Redis refused a call of the flush (an error it would give again). Results
        that could not be kept are sent again one by one, each refused one ends its job
        dead as ``result_refused``; any other refused call is dropped with an error
        line: its leases expire and the reaper gives the jobs back."""
        c, q, kind, _ = entry
        if sent is not None and len(sent[1]) > 1:
            for item in sent[1]:  # which one Redis refuses is not known: one per call
                self.st.buf[q].results.append(item)
                self._solo.add(item[0])
            self.st.flush_event.set()
            return
        if sent is not None:
            lease = sent[1][0][0]
            job = self._result_jobs.pop(lease, None)
            self._solo.discard(lease)
            if job is not None:
                self.bury_settled(job, "result_refused",
                                  RuntimeError(f"Redis refused to keep the result: {exc}"))
                return
        log.error("Redis refused %s (%s, queue %r): %s; dropped, the leases will expire and "
                  "the jobs run again", c.script, kind, q, exc)

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
