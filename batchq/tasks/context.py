"""The handler's own job: ``batchq.current_job()`` and its ``JobContext``.

While a handler runs, the worker's runner holds the job (or a batch handler's list of
jobs) in a context variable: one ``ContextVar.set`` per job (the next job's set replaces
it; the runner runs no user code in between), nothing else, so the context costs a job
next to nothing unless its handler asks for it. A sync handler
runs in the thread pool inside a copy of the runner's context
(``contextvars.copy_context().run``), so it sees the same job; a task an async handler
starts copies the context too. A context is never visible outside its job: the next job
of the runner is set on the runner's own context, never on a copy already taken.

``current_job()`` builds the ``JobContext`` on first use (one per job; the runner's
``ContextOwner`` keeps it while the job runs). Its fields are read from the decoded job
when asked; the few that Redis alone knows are read from Redis on first use, with the
worker's sync client (one round trip; in an async handler that blocks the event loop for
it): ``campaign`` and ``key`` (only for a campaign or keyed job, whose id ends in
``_m``: its ``jobmeta`` entry) and ``lease_deadline_ms`` (read again on every access: the
worker extends it every ``lease_s / 3``).

``progress(value, message)`` only notes the value: the worker's writer
(``batchq.worker.context``) writes it at most once per job every ``PROGRESS_EVERY_S``,
the last value winning, and writes the last one before the job's outcome is settled.
"""

from __future__ import annotations

import contextvars
import math
import threading
from typing import Any, Protocol

from ..store.keys import QueueKeys, split_shard

__all__ = [
    "MAX_MESSAGE_CHARS",
    "PROGRESS_EVERY_S",
    "ContextOwner",
    "JobContext",
    "context_of",
    "current_job",
]

PROGRESS_EVERY_S = 0.1
"""At most one progress write per job in this time (the last value wins)."""

MAX_MESSAGE_CHARS = 1000
"""The longest progress message kept (longer ones are cut, with a trailing ``…``)."""

_TRACKED_MARK = "_m"  # ids.TRACKED_MARK (ids stays below this module: no import needed)


class _Job(Protocol):
    """What a context reads of a job (``codec.Job``; not imported: codec imports us)."""

    id: str
    task: str
    queue: str
    attempt: int
    max_attempts: int
    priority: int
    enqueued_ms: int
    ready_ms: int
    lease: bytes


class ContextOwner(Protocol):
    """The worker's side of the contexts (``batchq.worker.context.Owner``)."""

    live: dict[bytes, JobContext]

    def keys(self, queue: str) -> QueueKeys: ...

    def sync_redis(self) -> Any: ...

    def mark(self, ctx: JobContext) -> None: ...


class _Recorder(Protocol):
    def record(self, status: str | int, message: str = "") -> None: ...


class RunnerSlot:
    """One runner's: its owner, its current item, when that started (``t0``, the
    runner's ``perf_counter`` clock; ``wall`` turns it into Unix seconds)."""

    __slots__ = ("item", "owner", "t0", "wall")

    def __init__(self, owner: ContextOwner, wall: float) -> None:
        self.owner = owner
        self.item: Any = None
        self.t0 = 0.0
        self.wall = wall


# the job (or the batch handler's list of jobs) whose handler runs in this context;
# after a first current_job() in it, its JobContext
job_var: contextvars.ContextVar[Any] = contextvars.ContextVar("batchq_job", default=None)
# the runner running it (set once per runner task)
slot_var: contextvars.ContextVar[RunnerSlot | None] = contextvars.ContextVar(
    "batchq_runner", default=None)
# a load run's recorder (batchq.load.probe.CurrentJob) while a load job runs
load_var: contextvars.ContextVar[_Recorder | None] = contextvars.ContextVar(
    "batchq_load_job", default=None)


class JobContext:
    """The job a handler runs, as ``batchq.current_job()`` (or ``job.context`` in a batch
    handler) returns it: RQ's ``get_current_job()``, Celery's ``self.request``, arq's
    ``ctx``, dramatiq's ``CurrentMessage``.

    ``id``, ``task``, ``queue`` (a sharded queue's base name), ``attempt`` (1 on the
    first run), ``max_attempts``, ``priority``, ``group`` and ``campaign`` (None without
    one), ``key`` (the dedup key, or None), ``enqueued_ms``, ``ready_ms`` (when it
    became runnable: its due time if delayed, the tick of a periodic job),
    ``lease_deadline_ms`` (server time after which another worker may take the job),
    ``started_ms`` (when this run started, this worker's clock)."""

    __slots__ = ("_dirty", "_ended", "_job", "_message", "_meta", "_owner", "_value",
                 "started_ms")

    def __init__(self, job: _Job, owner: ContextOwner | None, started_ms: int | None
                 ) -> None:
        self._job = job
        self._owner = owner
        self._meta: list[str] | None = None
        self._value: float | None = None
        self._message: str | None = None
        self._dirty = False
        self._ended = False
        self.started_ms = started_ms

    def __repr__(self) -> str:
        j = self._job
        return (f"JobContext(id={j.id!r}, task={j.task!r}, queue={self.queue!r}, "
                f"attempt={j.attempt}/{j.max_attempts})")

    # --- the fields --------------------------------------------------------------------

    @property
    def id(self) -> str:
        return self._job.id

    @property
    def task(self) -> str:
        return self._job.task

    @property
    def queue(self) -> str:
        return split_shard(self._job.queue)[0] if ":" in self._job.queue else self._job.queue

    @property
    def attempt(self) -> int:
        return self._job.attempt

    @property
    def max_attempts(self) -> int:
        return self._job.max_attempts

    @property
    def priority(self) -> int:
        return self._job.priority

    @property
    def enqueued_ms(self) -> int:
        return self._job.enqueued_ms

    @property
    def ready_ms(self) -> int:
        return self._job.ready_ms

    @property
    def group(self) -> str | None:
        """The job's group (``options(group=...)``): hex in its id, decoded here."""
        _, sep, tail = self._job.id.partition("~")
        if not sep:
            return None
        tail = tail.removesuffix(_TRACKED_MARK)
        try:
            return bytes.fromhex(tail).decode("utf-8")
        except ValueError:
            return tail

    @property
    def campaign(self) -> str | None:
        """The campaign id, or None (one Redis read on first use, for a tracked job)."""
        meta = self._read_meta()
        return meta[0] or None if meta else None

    @property
    def key(self) -> str | None:
        """The dedup key, or None (one Redis read on first use, for a tracked job)."""
        meta = self._read_meta()
        return meta[2] or None if meta and len(meta) > 2 else None

    @property
    def lease_deadline_ms(self) -> int | None:
        """The lease's deadline (server ms), read from Redis on each access; None when
        the lease is gone (the job was settled, or reaped)."""
        owner = self._need_owner()
        k = owner.keys(self._job.queue)
        lease = self._job.lease
        if lease[:2] == b":b":  # one lease for a pop's plain jobs: the bundle's
            score = owner.sync_redis().zscore(k.bundles, lease[:-2])
        else:
            score = owner.sync_redis().zscore(k.reserved, lease)
        return None if score is None else int(score)

    def _need_owner(self) -> ContextOwner:
        if self._owner is None:
            raise RuntimeError(f"job {self._job.id} is not run by a worker here")
        return self._owner

    def _read_meta(self) -> list[str] | None:
        if not self._job.id.endswith(_TRACKED_MARK):
            return None
        if self._meta is None:
            owner = self._need_owner()
            raw = owner.sync_redis().hget(owner.keys(self._job.queue).jobmeta, self._job.id)
            text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else ""
            self._meta = text.split("\n", 2)
        return self._meta

    # --- progress ----------------------------------------------------------------------

    @property
    def progress_value(self) -> float | None:
        """The last value given to ``progress`` in this run (None before)."""
        return self._value

    @property
    def progress_message(self) -> str | None:
        return self._message

    def progress(self, value: float, message: str | None = None) -> None:
        """Report how far the job is: ``value`` a number (a percentage 0-100, or a count
        of items done), ``message`` a short text (at most ``MAX_MESSAGE_CHARS``, cut
        beyond). Cheap enough to call per item: the worker writes at most once per job
        every ``PROGRESS_EVERY_S`` (the last value wins) and the last value before the
        job's outcome. ``app.job_info(id)``, ``batchq job show`` and the console read it."""
        if isinstance(value, bool) or not isinstance(value, int | float) \
                or not math.isfinite(value):
            raise ValueError(f"progress value must be a finite number, got {value!r}")
        if message is not None:
            if not isinstance(message, str):
                raise TypeError(f"progress message must be a str or None, got "
                                f"{type(message).__name__} {message!r:.60}")
            if len(message) > MAX_MESSAGE_CHARS:
                message = message[:MAX_MESSAGE_CHARS - 1] + "…"
        if self._ended:
            raise RuntimeError(f"job {self._job.id} has ended: its progress is final")
        self._value = value
        self._message = message
        if not self._dirty and self._owner is not None:
            self._dirty = True
            self._owner.mark(self)

    def take(self) -> tuple[float | None, str | None]:
        """The values to write now (the writer's: clears the dirty flag first, so a
        value set meanwhile is marked again)."""
        self._dirty = False
        return self._value, self._message

    @property
    def dirty(self) -> bool:
        return self._dirty

    def end(self) -> None:
        """The job's run is over: no more progress from here."""
        self._ended = True

    # --- load runs ---------------------------------------------------------------------

    def record(self, status: str | int, message: str = "") -> None:
        """A ``batchq bench load`` job's outcome without raising (``"ok"`` or ``""``: a
        success; anything else an error of that type, e.g. ``"429"``). Outside a load
        run it does nothing, so a task may call it in production code too."""
        rec = load_var.get()
        if rec is not None:
            rec.record(status, message)


_lock = threading.Lock()


def _context(job: _Job, slot: RunnerSlot | None) -> JobContext:
    owner = slot.owner if slot is not None else None
    if owner is None:
        return JobContext(job, None, None)
    ctx = owner.live.get(job.lease)
    if ctx is not None and ctx._job is job:
        return ctx
    with _lock:  # a sync handler's thread and the loop may both make it
        ctx = owner.live.get(job.lease)
        if ctx is not None and ctx._job is job:
            return ctx
        item = slot.item if slot is not None else None
        if item is job or (type(item) is list and job in item):
            ctx = owner.live[job.lease] = JobContext(
                job, owner, round((slot.t0 + slot.wall) * 1000) if slot is not None else None)
            return ctx
    # asked after its run (a thread left running past its timeout, a task the handler
    # started): its fields still read, its progress is final
    ctx = JobContext(job, owner, None)
    ctx._ended = True
    return ctx


def current_job() -> JobContext:
    """The job whose handler calls it (see ``JobContext``). Raises ``RuntimeError``
    outside a handler, and in a batch handler of more than one job (each ``Job`` of its
    list has its own: ``job.context``)."""
    item = job_var.get()
    if type(item) is JobContext:
        return item
    if item is None:
        raise RuntimeError(
            "batchq.current_job() is called outside a job: it works only while a handler "
            "runs (in the handler, in the threads of a sync one and in the tasks an async "
            "one starts)")
    if type(item) is list:
        if len(item) != 1:
            raise RuntimeError(
                f"batchq.current_job() in a batch handler of {len(item)} jobs: each job "
                "of its list has its own context, read `job.context` on each item")
        return _context(item[0], slot_var.get())
    ctx = _context(item, slot_var.get())
    job_var.set(ctx)  # this context's next call finds it at once
    return ctx


def context_of(job: _Job) -> JobContext:
    """``job.context``: the context of ``job`` while its handler (or its batch's) runs
    in this context; ``RuntimeError`` otherwise."""
    item = job_var.get()
    if type(item) is JobContext:
        if item._job is job:
            return item
    elif type(item) is list:
        slot = slot_var.get()
        # a batch handler reading each job's: made once each, then found by its lease
        ctx = slot.owner.live.get(job.lease) if slot is not None else None
        if ctx is not None and ctx._job is job:
            return ctx
        if any(j is job for j in item):
            return _context(job, slot)
    elif item is job:
        return _context(job, slot_var.get())
    raise RuntimeError(
        f"job {job.id} is not running in this context: job.context works only inside "
        "the handler (or batch handler) that runs it")

