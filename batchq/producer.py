"""Writing jobs: ``enqueue`` / ``enqueue_many`` and their asyncio twins.

A job is encoded once (header + msgpack body) and written by one script call:
``enqueue.lua`` for ready jobs, ``schedule.lua`` for delayed ones. ``enqueue_many``
streams any iterable in chunks of ``chunk`` jobs (one script call each) and sends
``window`` chunks per round trip, so a million jobs never sit in memory at once as
commands. A call whose reply is lost to a broken connection is retried with backoff
in *check* mode: the script first looks for the call's first job and writes nothing if
the earlier try had landed, so a reconnect never doubles a job.

Everything the worker could not run is refused here, before anything is written, with a
message naming the option or argument (``EnqueueOptions``, ``plan``, ``codec.header``,
``codec.encode_body``). The retry loop and the ``enqueue_many`` stream are I/O-free cores
(``_tries``, ``_Stream``) with a thin sync and a thin asyncio shell each. The producer
takes the app's ``Clients`` and never imports ``app``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

import redis
import redis.asyncio

from . import codec, tracked
from .clients import Clients
from .errors import CampaignClosed, EnqueueError, PayloadTooLarge
from .keys import QueueKeys
from .options import (
    MAX_DELAY_S,
    Call,
    EnqueueOptions,
    _check_queue,
    _check_seconds,
    call,
    eta_seconds,
)
from .scripts import arun_pipeline, calls, run_pipeline
from .seqs import SeqSource, areserve, entry_runs

__all__ = ["MAX_DELAY_S", "Call", "EnqueueOptions", "KeyFn", "aenqueue", "aenqueue_many",
           "call", "enqueue", "enqueue_many", "eta_seconds", "plan"]

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


class _PlanSource(Protocol):
    """What ``plan`` needs: key names and the payload limit (``Clients``; an ``App``)."""

    @property
    def max_payload_bytes(self) -> int: ...

    def keys(self, queue: str) -> QueueKeys: ...


@dataclass(frozen=True)
class _Plan:
    """Everything one enqueue call needs, resolved once."""

    keys: QueueKeys
    head: bytes
    task: str
    due: tuple[str, int] | None  # ("rel", ms) or ("abs", unix ms) or None for ready
    max_payload: int
    ref: str = ""  # the queue reference every id of this plan starts with
    campaign: str | None = None
    key_ttl_ms: int = 0
    tracked: bool = False
    """Written by enqueue_tracked.lua (a campaign or dedup keys): ids end in "_m", and
    ``entries`` lists alternate entry, dedup key ("" for none)."""

    @property
    def target(self) -> str:
        return self.keys.ready_for(int(self.head[:1]))

    def entry(self, args: Any, kwargs: Mapping[str, Any], now_ms: int,
              seq: Callable[[], int | None] | None = None) -> tuple[str, bytes]:
        due_ms = None
        if self.due is not None:
            due_ms = now_ms + self.due[1] if self.due[0] == "rel" else self.due[1]
        body = codec.encode_body(self.task, args, kwargs, now_ms, due_ms)
        jid = codec.new_id(self.ref, seq() if seq else None)  # no number for a bad job
        if self.tracked:
            jid += tracked.TRACKED_SUFFIX  # the sequence part, then the mark
        e = b"%s%s:%s" % (self.head, jid.encode(), body)
        if len(e) > self.max_payload:
            raise PayloadTooLarge(
                f"cannot enqueue {self.task}: encoded job is {len(e)} bytes, above the "
                f"limit of {self.max_payload} (App(max_payload_bytes=...))"
            )
        return jid, e

    def script_args(self, entries: list[bytes], check: bool) -> tuple[list[str], list[Any]]:
        p = int(self.head[:1])
        if self.tracked:
            mode, when = self.due or ("ready", 0)
            c = calls.enqueue_tracked(self.keys, p, mode, when, self.campaign or "",
                                      self.key_ttl_ms, tracked.TRIM_CHUNK, entries,
                                      check=check)
            return c.keys, c.args
        runs = entry_runs(self.head, entries) if self.due is None else ""
        c = (calls.enqueue(self.keys, p, entries, check=check, runs=runs) if self.due is None else
             calls.schedule(self.keys, p, self.due[0], self.due[1], entries, check=check))
        return c.keys, c.args


def plan(src: _PlanSource, task: str, queue: str, priority: int, max_attempts: int,
         delay_s: float | None, eta: datetime | float | None, *,
         campaign: str | None = None, key_ttl_s: float | None = None,
         keyed: bool = False) -> _Plan:
    """Resolve one enqueue call's target and header; refuses (naming the option) any
    value the scripts or the worker could not handle. ``campaign`` / ``keyed`` (dedup
    keys given) make the jobs tracked."""
    due: tuple[str, int] | None = None
    if delay_s is not None and _check_seconds("delay_s", delay_s, MAX_DELAY_S) > 0:
        due = ("rel", round(delay_s * 1000))
    elif eta is not None:
        # a naive datetime is local time, as datetime.timestamp() reads it
        due = ("abs", round(eta_seconds(eta) * 1000))
    ttl_s = tracked.DEFAULT_KEY_TTL_S if key_ttl_s is None else \
        _check_seconds("key_ttl_s", key_ttl_s, MAX_DELAY_S)
    return _Plan(src.keys(_check_queue("queue", queue)), codec.header(priority, max_attempts),
                 task, due, src.max_payload_bytes, codec.queue_ref(queue),
                 None if campaign is None else tracked.check_campaign_id(campaign),
                 round(ttl_s * 1000), campaign is not None or keyed)


def _split(item: Any) -> tuple[Any, Mapping[str, Any]]:
    if isinstance(item, tuple | list):
        return item, {}
    if isinstance(item, Call):
        return item.args, item.kwargs
    if isinstance(item, Mapping):
        return (), item
    return (item,), {}


KeyFn = Callable[[Any], "str | None"]


def _chunks(p: _Plan, items: Iterable[Any], seqs: Callable[[], int | None] | None,
            key_fn: KeyFn | None = None
            ) -> Iterator[tuple[list[str], list[bytes]]]:
    ids: list[str] = []
    entries: list[bytes] = []
    now_ms = int(time.time() * 1000)
    for n, item in enumerate(items, 1):
        args, kwargs = _split(item)
        try:
            jid, e = p.entry(args, kwargs, now_ms, seqs)
            if p.tracked:
                key = key_fn(item) if key_fn is not None else None
                entries += (e, b"" if key is None else tracked.check_key(key).encode())
        except (TypeError, ValueError) as exc:
            raise _at_item(exc, n - 1) from None
        ids.append(jid)
        if not p.tracked:
            entries.append(e)
        if len(ids) == CHUNK:
            yield ids, entries
            ids, entries = [], []
            if n % (CHUNK * WINDOW) == 0:
                now_ms = int(time.time() * 1000)
    if entries:
        yield ids, entries


def _at_item(exc: Exception, index: int) -> Exception:
    """``exc`` again, its message naming the item (the class kept: PayloadTooLarge)."""
    try:
        return type(exc)(f"item {index}: {exc}")
    except TypeError:  # an exception class with another constructor
        return (TypeError if isinstance(exc, TypeError) else ValueError)(
            f"item {index}: {exc}")


Window = list[tuple[list[str], list[bytes]]]


class _Stream:
    """The bookkeeping of one ``enqueue_many`` (no I/O): windows of chunks, and what
    Redis confirmed so far, for an exact ``EnqueueError``."""

    def __init__(self, p: _Plan, seqs: Callable[[], int | None],
                 key_fn: KeyFn | None = None) -> None:
        self.p, self.seqs = p, (seqs if p.due is None else None)
        self.key_fn = key_fn
        self.written: list[str] = []

    def windows(self, items: Iterable[Any]) -> Iterator[Window]:
        """Windows of chunks. An item that cannot be encoded (``TypeError``,
        ``PayloadTooLarge``) stops the stream; the error then carries ``written`` and
        ``ids`` of the jobs already in Redis, like ``EnqueueError``."""
        window: Window = []
        chunks = _chunks(self.p, items, self.seqs, self.key_fn)
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

    def steps(self, items: Iterable[Any]) -> Iterator[tuple[tuple[list[str], list[bytes]]
                                                          | None, Window]]:
        """What to send, window by window: ``(single, rest)``. ``single`` (or None) goes
        through the reconnect-safe single call: the first chunk (it also registers the
        queue) and a lone last chunk. ``rest`` goes in one pipeline."""
        for window in self.windows(items):
            single = window.pop(0) if not self.written or len(window) == 1 else None
            yield single, window

    def failed(self, exc: EnqueueError) -> EnqueueError:
        exc.written, exc.ids = len(self.written), self.written
        return exc

    def lost(self, window: Window, exc: Exception) -> EnqueueError:
        unknown = sum(len(ids) for ids, _ in window)
        return EnqueueError(
            f"connection lost during enqueue_many of {self.p.task}: {len(self.written)} jobs "
            f"written, {unknown} unknown: {exc}",
            written=len(self.written), ids=self.written, unknown=unknown)

    def record(self, window: Window, results: list[Any]) -> None:
        """Count what a pipelined window wrote; an error result raises ``EnqueueError``."""
        first_error: BaseException | None = None
        for (ids, _), res in zip(window, results, strict=True):
            if isinstance(res, BaseException):
                first_error = first_error or res
            elif self.p.tracked:
                try:
                    self.written.extend(tracked.ids_of(self.p.campaign, ids, res))
                except (CampaignClosed, tracked.NotJoined) as exc:
                    first_error = first_error or exc
            else:
                self.written.extend(ids)
        if first_error is not None:
            raise EnqueueError(
                f"enqueue_many of {self.p.task} failed after writing {len(self.written)} "
                f"jobs: {first_error}", written=len(self.written), ids=self.written,
            ) from first_error


# --- the retry loop: one core, two shells ----------------------------------------------


def _tries(p: _Plan, entries: list[bytes]) -> Iterator[tuple[float, list[str], list[Any]]]:
    """The tries of one write: (pause before it, keys, args). Every try after the first
    is in check mode, so a try whose reply was lost is not written twice."""
    for attempt, pause in enumerate((0.0, *RETRY_DELAYS_S)):
        keys, args = p.script_args(entries, check=attempt > 0)
        yield pause, keys, args


def _refused(p: _Plan, exc: redis.ResponseError) -> EnqueueError:
    return EnqueueError(f"Redis refused to enqueue {p.task}: {exc}", written=0)


def _unreachable(p: _Plan, last: BaseException | None, n: int) -> EnqueueError:
    return EnqueueError(f"cannot reach Redis to enqueue {p.task}: {last}", unknown=n)


# --- sync ------------------------------------------------------------------------------


def _with_retry_sync(c: Clients, p: _Plan, entries: list[bytes]) -> Any:
    last: BaseException | None = None
    name = "enqueue_tracked" if p.tracked else "schedule" if p.due else "enqueue"
    for pause, keys, args in _tries(p, entries):
        if pause:
            time.sleep(pause)
        try:
            c.register_queue(p.keys.queue)  # once per process; retried like the write
            return c.sync_scripts.by_name[name](keys, args)
        except _RETRY_WRITE_ERRORS as exc:
            last = exc
        except redis.ResponseError as exc:  # e.g. OOM: the script did not run
            raise _refused(p, exc) from exc
    raise _unreachable(p, last, len(entries)) from last


def _write_tracked_sync(c: Clients, p: _Plan, ids: list[str], entries: list[bytes]
                        ) -> list[str]:
    """One tracked write (joining the campaign to the queue first, once per process)."""
    for again in (False, True):
        if p.campaign is not None:
            tracked.join(c, p.campaign, p.keys.queue)
        try:
            return tracked.ids_of(p.campaign, ids, _with_retry_sync(c, p, entries))
        except tracked.NotJoined:
            tracked.forget(c, p.campaign or "", p.keys.queue)
            if again:
                raise CampaignClosed(p.campaign or "", f"campaign {p.campaign!r} is not "
                                     f"open on queue {p.keys.queue!r}") from None
    raise AssertionError("unreachable")


def enqueue(c: Clients, p: _Plan, args: Any, kwargs: Mapping[str, Any],
            key: str | None = None) -> str:
    jid, e = p.entry(args, kwargs, int(time.time() * 1000),
                     SeqSource(c, p.keys) if p.due is None else None)
    if p.tracked:
        return _write_tracked_sync(c, p, [jid], [e, (key or "").encode()])[0]
    _with_retry_sync(c, p, [e])
    return jid


def enqueue_many(c: Clients, p: _Plan, items: Iterable[Any],
                 key_fn: KeyFn | None = None) -> list[str]:
    st = _Stream(p, SeqSource(c, p.keys, want=CHUNK), key_fn)
    for single, rest in st.steps(items):
        if single is not None:
            try:
                if p.tracked:
                    st.written.extend(_write_tracked_sync(c, p, *single))
                    single = None
                else:
                    _with_retry_sync(c, p, single[1])
            except EnqueueError as exc:
                raise st.failed(exc) from exc.__cause__
            if single is not None:
                st.written.extend(single[0])
        if rest:
            script = c.sync_scripts.by_name[
                "enqueue_tracked" if p.tracked else "schedule" if p.due else "enqueue"]
            pipe = c.redis.pipeline(transaction=False)
            for _, entries in rest:
                keys, args = p.script_args(entries, check=False)
                script(keys, args, client=pipe)
            try:
                results = run_pipeline(pipe, c.redis)
            except _RETRY_WRITE_ERRORS as exc:
                raise st.lost(rest, exc) from exc
            st.record(rest, results)
    return st.written


# --- asyncio ---------------------------------------------------------------------------


async def _with_retry_async(c: Clients, p: _Plan, entries: list[bytes]) -> Any:
    scripts = c.async_scripts()
    last: BaseException | None = None
    name = "enqueue_tracked" if p.tracked else "schedule" if p.due else "enqueue"
    for pause, keys, args in _tries(p, entries):
        if pause:
            await asyncio.sleep(pause)
        try:
            await c.aregister_queue(p.keys.queue)  # once per process; retried like the write
            return await scripts.by_name[name](keys, args)
        except _RETRY_WRITE_ERRORS as exc:
            last = exc
        except redis.ResponseError as exc:  # e.g. OOM: the script did not run
            raise _refused(p, exc) from exc
    raise _unreachable(p, last, len(entries)) from last


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

    async def submit(self, c: Clients, p: _Plan, entry: bytes) -> None:
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        slot = self._pending.get(p)
        if slot is None:
            self._pending[p] = ([entry], [fut])
            if p not in self._busy:
                self._busy.add(p)
                asyncio.get_running_loop().create_task(self._drain(c, p))
        else:
            slot[0].append(entry)
            slot[1].append(fut)
        await fut

    async def _drain(self, c: Clients, p: _Plan) -> None:
        try:
            while p in self._pending:
                entries, futs = self._pending.pop(p)
                for i in range(0, len(entries), CHUNK):
                    part = futs[i : i + CHUNK]
                    try:
                        await _with_retry_async(c, p, entries[i : i + CHUNK])
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


def coalescer(c: Clients) -> Coalescer:
    """The ``aenqueue`` coalescer of the running event loop."""
    return c.per_loop(Coalescer)


def _own_copy(exc: Exception, shared_by: int) -> Exception:
    """One exception object per waiting caller (tracebacks are per raise)."""
    if isinstance(exc, EnqueueError):
        note = f" (one script call carried {shared_by} jobs)" if shared_by > 1 else ""
        own = EnqueueError(f"{exc}{note}", unknown=1 if exc.unknown else 0)
        own.__cause__ = exc.__cause__
        return own
    return exc


async def _write_tracked_async(c: Clients, p: _Plan, ids: list[str], entries: list[bytes]
                               ) -> list[str]:
    """``_write_tracked_sync`` for asyncio code (tracked jobs skip the coalescer)."""
    for again in (False, True):
        if p.campaign is not None:
            await tracked.ajoin(c, p.campaign, p.keys.queue)
        try:
            return tracked.ids_of(p.campaign, ids, await _with_retry_async(c, p, entries))
        except tracked.NotJoined:
            tracked.forget(c, p.campaign or "", p.keys.queue)
            if again:
                raise CampaignClosed(p.campaign or "", f"campaign {p.campaign!r} is not "
                                     f"open on queue {p.keys.queue!r}") from None
    raise AssertionError("unreachable")


async def aenqueue(c: Clients, p: _Plan, args: Any, kwargs: Mapping[str, Any],
                   key: str | None = None) -> str:
    runs = await areserve(c, p.keys, 1) if p.due is None else []
    jid, e = p.entry(args, kwargs, int(time.time() * 1000), SeqSource(c, p.keys, runs))
    if p.tracked:
        return (await _write_tracked_async(c, p, [jid], [e, (key or "").encode()]))[0]
    await coalescer(c).submit(c, p, e)
    return jid


async def aenqueue_many(c: Clients, p: _Plan, items: Iterable[Any],
                        key_fn: KeyFn | None = None) -> list[str]:
    items = list(items)  # its length: the sequence numbers are reserved up front
    st = _Stream(p, SeqSource(c, p.keys, await areserve(c, p.keys, len(items))), key_fn)
    for single, rest in st.steps(items):
        if single is not None:
            try:
                if p.tracked:
                    st.written.extend(await _write_tracked_async(c, p, *single))
                    single = None
                else:
                    await _with_retry_async(c, p, single[1])
            except EnqueueError as exc:
                raise st.failed(exc) from exc.__cause__
            if single is not None:
                st.written.extend(single[0])
        if rest:
            scripts = c.async_scripts()
            script = scripts.by_name[
                "enqueue_tracked" if p.tracked else "schedule" if p.due else "enqueue"]
            pipe = c.async_redis().pipeline(transaction=False)
            for _, entries in rest:
                keys, args = p.script_args(entries, check=False)
                await script(keys, args, client=pipe)
            try:
                results = await arun_pipeline(pipe, c.async_redis())
            except _RETRY_WRITE_ERRORS as exc:
                raise st.lost(rest, exc) from exc
            st.record(rest, results)
    return st.written
