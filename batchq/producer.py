"""Writing jobs: ``enqueue`` / ``enqueue_many`` and their asyncio twins.

A job is encoded once (header + msgpack body) and written by one script call:
``enqueue.lua`` for ready jobs, ``schedule.lua`` for delayed ones. ``enqueue_many``
streams any iterable in chunks of ``chunk`` jobs (one script call each) and sends
``window`` chunks per round trip, so a million jobs never sit in memory at once as
commands; the sync one encodes the next window while a helper thread has the previous
one on the wire (``_InFlight``). A call whose reply is lost to a broken connection is
retried with backoff in *check* mode: the script first looks for the call's first job
and writes nothing if the earlier try had landed, so a reconnect never doubles a job.

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
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import redis
import redis.asyncio

from . import limits, tracked
from .clients import Clients
from .errors import CampaignClosed, EnqueueError, QuotaExceeded
from .options import (
    MAX_DELAY_S,
    Call,
    EnqueueOptions,
    call,
    eta_seconds,
)
from .plan import Plan, plan
from .scripts import arun_pipeline, run_pipeline
from .seqs import SeqSource, areserve
from .tracked import MAX_KEY_BYTES

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


_SCALARS = frozenset((int, str, bytes, float))


def _split(item: Any) -> tuple[Any, Mapping[str, Any]]:
    t = type(item)
    if t is tuple or t is list:
        return item, {}
    if t in _SCALARS:  # the common one-argument rows, without the Mapping ABC check
        return (item,), {}
    if isinstance(item, tuple | list):
        return item, {}
    if isinstance(item, Call):
        return item.args, item.kwargs
    if isinstance(item, Mapping):
        return (), item
    return (item,), {}


KeyFn = Callable[[Any], "str | None"]


def _chunks(p: Plan, items: Iterable[Any], seqs: Callable[[], int | None] | None,
            key_fn: KeyFn | None = None
            ) -> Iterator[tuple[list[str], list[bytes]]]:
    ids: list[str] = []
    entries: list[bytes] = []
    now_ms = int(time.time() * 1000)
    entry, check_key, keyed = p.entry, tracked.check_key, p.tracked
    for n, item in enumerate(items, 1):
        args, kwargs = _split(item)
        try:
            jid, e = entry(args, kwargs, now_ms, seqs)
            if keyed:
                key = key_fn(item) if key_fn is not None else None
                if key is None:
                    entries += (e, b"")
                elif type(key) is str and key.isascii() and 0 < len(key) <= MAX_KEY_BYTES:
                    entries += (e, key.encode())  # check_key's fast path, inline
                else:
                    entries += (e, check_key(key).encode())
            else:
                entries.append(e)
        except (TypeError, ValueError) as exc:
            raise _at_item(exc, n - 1) from None
        ids.append(jid)
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

    def __init__(self, p: Plan, seqs: Callable[[], int | None],
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
        quota = False
        for (ids, _), res in zip(window, results, strict=True):
            if isinstance(res, BaseException):
                first_error = first_error or res
            elif self.p.group and res == -2:
                quota = True  # this chunk was not written (a smaller later one may be)
            elif self.p.tracked:
                try:
                    self.written.extend(tracked.ids_of(self.p.campaign, ids, res))
                except (CampaignClosed, tracked.NotJoined) as exc:
                    first_error = first_error or exc
            else:
                self.written.extend(ids)
        if first_error is None and quota:
            _quota_checked(self.p, -2, self.written)
        if first_error is not None:
            raise EnqueueError(
                f"enqueue_many of {self.p.task} failed after writing {len(self.written)} "
                f"jobs: {first_error}", written=len(self.written), ids=self.written,
            ) from first_error


# --- the retry loop: one core, two shells ----------------------------------------------


def _tries(p: Plan, entries: list[bytes]) -> Iterator[tuple[float, list[str], list[Any]]]:
    """The tries of one write: (pause before it, keys, args). Every try after the first
    is in check mode, so a try whose reply was lost is not written twice."""
    for attempt, pause in enumerate((0.0, *RETRY_DELAYS_S)):
        keys, args = p.script_args(entries, check=attempt > 0)
        yield pause, keys, args


def _quota_checked(p: Plan, res: Any, written: list[str] | None = None) -> Any:
    """``res`` of a write; ``QuotaExceeded`` when enqueue_group.lua refused it (-2)."""
    if p.group and res == -2:
        group = limits.group_name(p.group)
        done = written or []
        raise QuotaExceeded(
            p.keys.queue, group,
            f"cannot enqueue {p.task}: group {group!r} of queue {p.keys.queue!r} would go "
            f"past its max_pending (Queue.limit); nothing of this write was stored"
            + (f" ({len(done)} jobs of this enqueue_many were, before it)" if done else ""),
            written=len(done), ids=done)
    return res


def _refused(p: Plan, exc: redis.ResponseError) -> EnqueueError:
    return EnqueueError(f"Redis refused to enqueue {p.task}: {exc}", written=0)


def _unreachable(p: Plan, last: BaseException | None, n: int) -> EnqueueError:
    return EnqueueError(f"cannot reach Redis to enqueue {p.task}: {last}", unknown=n)


# --- sync ------------------------------------------------------------------------------


def _with_retry_sync(c: Clients, p: Plan, entries: list[bytes]) -> Any:
    last: BaseException | None = None
    for pause, keys, args in _tries(p, entries):
        if pause:
            time.sleep(pause)
        try:
            c.register_queue(p.keys.queue)  # once per process; retried like the write
            return _quota_checked(p, c.sync_scripts.by_name[p.script](keys, args))
        except _RETRY_WRITE_ERRORS as exc:
            last = exc
        except redis.ResponseError as exc:  # e.g. OOM: the script did not run
            raise _refused(p, exc) from exc
    raise _unreachable(p, last, len(entries)) from last


def _write_tracked_sync(c: Clients, p: Plan, ids: list[str], entries: list[bytes]
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


def enqueue(c: Clients, p: Plan, args: Any, kwargs: Mapping[str, Any],
            key: str | None = None) -> str:
    jid, e = p.entry(args, kwargs, int(time.time() * 1000),
                     SeqSource(c, p.keys) if p.due is None else None)
    if p.tracked:
        return _write_tracked_sync(c, p, [jid], [e, (key or "").encode()])[0]
    _with_retry_sync(c, p, [e])
    return jid


class _InFlight:
    """At most one pipelined window on the wire, sent by a helper thread: the caller
    encodes the next window meanwhile (Redis runs window N while Python encodes N+1).
    Windows are still written one after another, in order, and each is recorded before
    the next is sent, so ``written`` / ``ids`` stay exact."""

    def __init__(self) -> None:
        self._pool: ThreadPoolExecutor | None = None
        self._job: tuple[Window, Future[list[Any]]] | None = None

    def send(self, c: Clients, p: Plan, rest: Window) -> None:
        script = c.sync_scripts.by_name[p.script]
        pipe = c.redis.pipeline(transaction=False)
        for _, entries in rest:
            keys, args = p.script_args(entries, check=False)
            script(keys, args, client=pipe)
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="batchq-enqueue")
        self._job = rest, self._pool.submit(run_pipeline, pipe, c.redis)

    def wait(self, st: _Stream) -> None:
        """Record the window on the wire, if any (``EnqueueError`` if it failed)."""
        if self._job is None:
            return
        rest, fut = self._job
        self._job = None
        try:
            results = fut.result()
        except _RETRY_WRITE_ERRORS as exc:
            raise st.lost(rest, exc) from exc
        st.record(rest, results)

    def close(self) -> None:
        """Let a window still on the wire finish (its jobs are then in Redis, unrecorded:
        only when the caller is raising another exception), and stop the thread."""
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None


def enqueue_many(c: Clients, p: Plan, items: Iterable[Any],
                 key_fn: KeyFn | None = None) -> list[str]:
    st = _Stream(p, SeqSource(c, p.keys, want=CHUNK), key_fn)
    flight = _InFlight()
    try:
        steps = st.steps(items)
        while True:
            try:
                step = next(steps, None)  # encodes while the previous window is on the wire
            except (TypeError, ValueError) as exc:  # an item that cannot be encoded
                flight.wait(st)
                exc.written = len(st.written)  # type: ignore[union-attr]
                raise
            flight.wait(st)
            if step is None:
                break
            single, rest = step
            if single is not None:
                try:
                    if p.tracked:
                        st.written.extend(_write_tracked_sync(c, p, *single))
                        single = None
                    else:
                        _with_retry_sync(c, p, single[1])
                except QuotaExceeded:
                    _quota_checked(p, -2, st.written)
                except EnqueueError as exc:
                    raise st.failed(exc) from exc.__cause__
                if single is not None:
                    st.written.extend(single[0])
            if rest:
                flight.send(c, p, rest)
    finally:
        flight.close()
    return st.written


# --- asyncio ---------------------------------------------------------------------------


async def _with_retry_async(c: Clients, p: Plan, entries: list[bytes]) -> Any:
    scripts = c.async_scripts()
    last: BaseException | None = None
    for pause, keys, args in _tries(p, entries):
        if pause:
            await asyncio.sleep(pause)
        try:
            await c.aregister_queue(p.keys.queue)  # once per process; retried like the write
            return _quota_checked(p, await scripts.by_name[p.script](keys, args))
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
        self._pending: dict[Plan, tuple[list[bytes], list[asyncio.Future[None]]]] = {}
        self._busy: set[Plan] = set()

    async def submit(self, c: Clients, p: Plan, entry: bytes) -> None:
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

    async def _drain(self, c: Clients, p: Plan) -> None:
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


async def _write_tracked_async(c: Clients, p: Plan, ids: list[str], entries: list[bytes]
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


async def aenqueue(c: Clients, p: Plan, args: Any, kwargs: Mapping[str, Any],
                   key: str | None = None) -> str:
    body = p.body(args, kwargs, int(time.time() * 1000))  # a bad job reserves nothing
    runs = await areserve(c, p.keys, 1) if p.due is None else []
    jid, e = p.finish(body, SeqSource(c, p.keys, runs))
    if p.tracked:
        return (await _write_tracked_async(c, p, [jid], [e, (key or "").encode()]))[0]
    await coalescer(c).submit(c, p, e)
    return jid


async def aenqueue_many(c: Clients, p: Plan, items: Iterable[Any],
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
            except QuotaExceeded:
                _quota_checked(p, -2, st.written)
            except EnqueueError as exc:
                raise st.failed(exc) from exc.__cause__
            if single is not None:
                st.written.extend(single[0])
        if rest:
            scripts = c.async_scripts()
            script = scripts.by_name[
                p.script]
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
