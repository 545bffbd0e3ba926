"""Writing jobs: ``enqueue`` / ``enqueue_many`` and their asyncio twins.

A job is encoded once (header + msgpack body) and written by one script call:
``enqueue.lua`` for ready jobs, ``schedule.lua`` for delayed ones. ``enqueue_many``
streams any iterable in chunks of ``chunk`` jobs (one script call each) and sends
``window`` chunks per round trip, so a million jobs never sit in memory at once as
commands. A call whose reply is lost to a broken connection is retried with backoff
in *check* mode: the script first looks for the call's first job and writes nothing if
the earlier try had landed, so a reconnect never doubles a job.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

import redis
import redis.asyncio

from . import codec
from .errors import EnqueueError, PayloadTooLarge
from .keys import MAX_PRIORITY, QueueKeys
from .scripts import arun_pipeline, calls, run_pipeline

if TYPE_CHECKING:
    from .app import App

CHUNK = 1000
"""Jobs per script call (Lua's unpack limit is about 8000 arguments)."""

WINDOW = 8
"""Script calls per pipeline round trip in ``enqueue_many``."""

RETRY_DELAYS_S = (0.05, 0.2, 0.5, 1.0, 2.0)
"""Backoff between tries of a write whose connection failed (about 4 s in all)."""

_RETRY_WRITE_ERRORS = (redis.ConnectionError, redis.TimeoutError, redis.exceptions.TryAgainError,
                redis.exceptions.ClusterError, RuntimeError)
"""Errors after which a write is retried (in check mode): a lost connection (under uvloop
a write to a reset connection raises RuntimeError), or a Redis Cluster slot moving (the
script did not run)."""


class Call:
    """Positional and keyword arguments of one job, for ``enqueue_many``."""

    __slots__ = ("args", "kwargs")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.args = args
        self.kwargs = kwargs


def call(*args: Any, **kwargs: Any) -> Call:
    """One job's arguments for ``enqueue_many`` when it needs both args and kwargs."""
    return Call(*args, **kwargs)


@dataclass(frozen=True)
class EnqueueOptions:
    """Per-enqueue choices; ``None`` means the task's default."""

    queue: str | None = None
    priority: int | None = None
    max_attempts: int | None = None
    delay_s: float | None = None
    eta: datetime | float | None = None

    def __post_init__(self) -> None:
        if self.priority is not None and not 0 <= self.priority <= MAX_PRIORITY:
            raise ValueError(f"priority must be 0..{MAX_PRIORITY}, got {self.priority}")
        if self.max_attempts is not None and self.max_attempts < 1:
            raise ValueError("max_attempts must be at least 1")
        if self.delay_s is not None and self.eta is not None:
            raise ValueError("give delay_s or eta, not both")
        if self.delay_s is not None and self.delay_s < 0:
            raise ValueError("delay_s must not be negative")

    def merged(self, other: EnqueueOptions) -> EnqueueOptions:
        """These options with the fields ``other`` sets taking precedence."""
        return EnqueueOptions(
            queue=other.queue if other.queue is not None else self.queue,
            priority=other.priority if other.priority is not None else self.priority,
            max_attempts=other.max_attempts if other.max_attempts is not None
            else self.max_attempts,
            delay_s=other.delay_s if other.delay_s is not None
            else (None if other.eta is not None else self.delay_s),
            eta=other.eta if other.eta is not None
            else (None if other.delay_s is not None else self.eta),
        )


@dataclass(frozen=True)
class _Plan:
    """Everything one enqueue call needs, resolved once."""

    keys: QueueKeys
    head: bytes
    task: str
    due: tuple[str, int] | None  # ("rel", ms) or ("abs", unix ms) or None for ready
    max_payload: int

    @property
    def target(self) -> str:
        return self.keys.ready_for(int(self.head[:1]))

    def entry(self, args: Any, kwargs: Mapping[str, Any], now_ms: int) -> tuple[str, bytes]:
        jid = codec.new_id()
        due_ms = None
        if self.due is not None:
            due_ms = now_ms + self.due[1] if self.due[0] == "rel" else self.due[1]
        body = codec.encode_body(self.task, args, kwargs, now_ms, due_ms)
        e = b"%s%s:%s" % (self.head, jid.encode(), body)
        if len(e) > self.max_payload:
            raise PayloadTooLarge(
                f"cannot enqueue {self.task}: encoded job is {len(e)} bytes, above the "
                f"limit of {self.max_payload} (App(max_payload_bytes=...))"
            )
        return jid, e

    def script_args(self, entries: list[bytes], check: bool) -> tuple[list[str], list[Any]]:
        p = int(self.head[:1])
        c = (calls.enqueue(self.keys, p, entries, check=check) if self.due is None else
             calls.schedule(self.keys, p, self.due[0], self.due[1], entries, check=check))
        return c.keys, c.args


def plan(app: App, task: str, queue: str, priority: int, max_attempts: int,
         delay_s: float | None, eta: datetime | float | None) -> _Plan:
    due: tuple[str, int] | None = None
    if delay_s is not None and delay_s > 0:
        due = ("rel", round(delay_s * 1000))
    elif eta is not None:
        # a naive datetime is local time, as datetime.timestamp() reads it
        ts = eta.timestamp() if isinstance(eta, datetime) else float(eta)
        due = ("abs", round(ts * 1000))
    return _Plan(app.keys(queue), codec.header(priority, max_attempts), task, due,
                 app.max_payload_bytes)


def _split(item: Any) -> tuple[Any, Mapping[str, Any]]:
    if isinstance(item, tuple | list):
        return item, {}
    if isinstance(item, Call):
        return item.args, item.kwargs
    if isinstance(item, Mapping):
        return (), item
    return (item,), {}


def _chunks(p: _Plan, items: Iterable[Any]) -> Iterator[tuple[list[str], list[bytes]]]:
    ids: list[str] = []
    entries: list[bytes] = []
    now_ms = int(time.time() * 1000)
    for n, item in enumerate(items, 1):
        args, kwargs = _split(item)
        jid, e = p.entry(args, kwargs, now_ms)
        ids.append(jid)
        entries.append(e)
        if len(entries) == CHUNK:
            yield ids, entries
            ids, entries = [], []
            if n % (CHUNK * WINDOW) == 0:
                now_ms = int(time.time() * 1000)
    if entries:
        yield ids, entries


class _Stream:
    """The bookkeeping of one ``enqueue_many`` (no I/O): windows of chunks, and what
    Redis confirmed so far, for an exact ``EnqueueError``."""

    def __init__(self, p: _Plan) -> None:
        self.p = p
        self.written: list[str] = []

    def windows(self, items: Iterable[Any]) -> Iterator[list[tuple[list[str], list[bytes]]]]:
        """Windows of chunks. An item that cannot be encoded (``TypeError``,
        ``PayloadTooLarge``) stops the stream; the error then carries ``written`` and
        ``ids`` of the jobs already in Redis, like ``EnqueueError``."""
        window: list[tuple[list[str], list[bytes]]] = []
        chunks = _chunks(self.p, items)
        while True:
            try:
                chunk = next(chunks, None)
            except (TypeError, ValueError) as exc:
                exc.written, exc.ids = len(self.written), self.written  # type: ignore[union-attr]
                raise
            if chunk is None:
                break
            window.append(chunk)
            if len(window) == WINDOW:
                yield window
                window = []
        if window:
            yield window

    def safe_path(self, window: list[tuple[list[str], list[bytes]]]) -> bool:
        """The first chunk (it also registers the queue) and a lone last chunk go through
        the reconnect-safe single call."""
        return not self.written or len(window) == 1

    def failed(self, exc: EnqueueError) -> EnqueueError:
        exc.written, exc.ids = len(self.written), self.written
        return exc

    def lost(self, window: list[tuple[list[str], list[bytes]]], exc: Exception) -> EnqueueError:
        unknown = sum(len(ids) for ids, _ in window)
        return EnqueueError(
            f"connection lost during enqueue_many of {self.p.task}: {len(self.written)} jobs "
            f"written, {unknown} unknown: {exc}",
            written=len(self.written), ids=self.written, unknown=unknown)

    def record(self, window: list[tuple[list[str], list[bytes]]], results: list[Any]) -> None:
        """Count what a pipelined window wrote; an error result raises ``EnqueueError``."""
        first_error: BaseException | None = None
        for (ids, _), res in zip(window, results, strict=True):
            if isinstance(res, BaseException):
                first_error = first_error or res
            else:
                self.written.extend(ids)
        if first_error is not None:
            raise EnqueueError(
                f"enqueue_many of {self.p.task} failed after writing {len(self.written)} "
                f"jobs: {first_error}", written=len(self.written), ids=self.written,
            ) from first_error


# --- sync ------------------------------------------------------------------------------


def _with_retry_sync(app: App, p: _Plan, entries: list[bytes]) -> None:
    for attempt, pause in enumerate((0.0, *RETRY_DELAYS_S)):
        if pause:
            time.sleep(pause)
        keys, args = p.script_args(entries, check=attempt > 0)
        try:
            app.register_queue(p.keys.queue)  # once per process; retried like the write
            app.sync_scripts.schedule(keys, args) if p.due else app.sync_scripts.enqueue(keys, args)
            return
        except _RETRY_WRITE_ERRORS as exc:
            last = exc
        except redis.ResponseError as exc:  # e.g. OOM: the script did not run
            raise EnqueueError(f"Redis refused to enqueue {p.task}: {exc}",
                               written=0) from exc
    raise EnqueueError(f"cannot reach Redis to enqueue {p.task}: {last}", unknown=len(entries)) \
        from last


def enqueue(app: App, p: _Plan, args: Any, kwargs: Mapping[str, Any]) -> str:
    jid, e = p.entry(args, kwargs, int(time.time() * 1000))
    _with_retry_sync(app, p, [e])
    return jid


def enqueue_many(app: App, p: _Plan, items: Iterable[Any]) -> list[str]:
    st = _Stream(p)
    script = app.sync_scripts.schedule if p.due else app.sync_scripts.enqueue
    for window in st.windows(items):
        if st.safe_path(window):
            ids, entries = window.pop(0)
            try:
                _with_retry_sync(app, p, entries)
            except EnqueueError as exc:
                raise st.failed(exc) from exc.__cause__
            st.written.extend(ids)
        if window:
            pipe = app.redis.pipeline(transaction=False)
            for _, entries in window:
                keys, args = p.script_args(entries, check=False)
                script(keys, args, client=pipe)
            try:
                results = run_pipeline(pipe, app.redis)
            except _RETRY_WRITE_ERRORS as exc:
                raise st.lost(window, exc) from exc
            st.record(window, results)
    return st.written


# --- asyncio ---------------------------------------------------------------------------


async def _with_retry_async(app: App, p: _Plan, entries: list[bytes]) -> None:
    scripts = app.async_scripts()
    for attempt, pause in enumerate((0.0, *RETRY_DELAYS_S)):
        if pause:
            await asyncio.sleep(pause)
        keys, args = p.script_args(entries, check=attempt > 0)
        try:
            await app.aregister_queue(p.keys.queue)  # once per process; retried like the write
            await (scripts.schedule if p.due else scripts.enqueue)(keys, args)
            return
        except _RETRY_WRITE_ERRORS as exc:
            last = exc
        except redis.ResponseError as exc:  # e.g. OOM: the script did not run
            raise EnqueueError(f"Redis refused to enqueue {p.task}: {exc}",
                               written=0) from exc
    raise EnqueueError(f"cannot reach Redis to enqueue {p.task}: {last}", unknown=len(entries)) \
        from last


class Coalescer:
    """Concurrent ``aenqueue`` calls of one event loop share script calls.

    The first call for a target (queue, priority, delay) starts a write at once; calls
    that arrive while it is on the wire wait for the next one and go together, up to
    ``CHUNK`` jobs per script call. Many coroutines enqueueing one job each then cost one
    round trip per batch instead of one each, with no added latency for a lone caller.
    """

    def __init__(self) -> None:
        self._pending: dict[_Plan, tuple[list[bytes], list[asyncio.Future[None]]]] = {}
        self._busy: set[_Plan] = set()

    async def submit(self, app: App, p: _Plan, entry: bytes) -> None:
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        slot = self._pending.get(p)
        if slot is None:
            self._pending[p] = ([entry], [fut])
            if p not in self._busy:
                self._busy.add(p)
                asyncio.get_running_loop().create_task(self._drain(app, p))
        else:
            slot[0].append(entry)
            slot[1].append(fut)
        await fut

    async def _drain(self, app: App, p: _Plan) -> None:
        try:
            while p in self._pending:
                entries, futs = self._pending.pop(p)
                for i in range(0, len(entries), CHUNK):
                    part = futs[i : i + CHUNK]
                    try:
                        await _with_retry_async(app, p, entries[i : i + CHUNK])
                    except Exception as exc:
                        for f in part:
                            if not f.done():
                                f.set_exception(_own_copy(exc, len(part)))
                    else:
                        for f in part:
                            if not f.done():
                                f.set_result(None)
        finally:
            self._busy.discard(p)


def _own_copy(exc: Exception, shared_by: int) -> Exception:
    """One exception object per waiting caller (tracebacks are per raise)."""
    if isinstance(exc, EnqueueError):
        note = f" (one script call carried {shared_by} jobs)" if shared_by > 1 else ""
        own = EnqueueError(f"{exc}{note}", unknown=1 if exc.unknown else 0)
        own.__cause__ = exc.__cause__
        return own
    return exc


async def aenqueue(app: App, p: _Plan, args: Any, kwargs: Mapping[str, Any]) -> str:
    jid, e = p.entry(args, kwargs, int(time.time() * 1000))
    await app.coalescer().submit(app, p, e)
    return jid


async def aenqueue_many(app: App, p: _Plan, items: Iterable[Any]) -> list[str]:
    st = _Stream(p)
    scripts = app.async_scripts()
    script = scripts.schedule if p.due else scripts.enqueue
    for window in st.windows(items):
        if st.safe_path(window):
            ids, entries = window.pop(0)
            try:
                await _with_retry_async(app, p, entries)
            except EnqueueError as exc:
                raise st.failed(exc) from exc.__cause__
            st.written.extend(ids)
        if window:
            pipe = app.async_redis().pipeline(transaction=False)
            for _, entries in window:
                keys, args = p.script_args(entries, check=False)
                await script(keys, args, client=pipe)
            try:
                results = await arun_pipeline(pipe, app.async_redis())
            except _RETRY_WRITE_ERRORS as exc:
                raise st.lost(window, exc) from exc
            st.record(window, results)
    return st.written
