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
``codec.encode_body``). The writes are I/O-free cores (``_twins``: ``_one``, ``_many``,
``_with_retry``, ``_write_tracked``; the chunking is ``stream.Stream``) with a thin sync
and a thin asyncio shell each; only the pipelined window differs (``_InFlight`` on a
helper thread, ``_send_async`` on the loop). The producer takes the app's ``Clients``
and never imports ``app``.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Iterable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import redis
import redis.asyncio

from ..store import replicas
from ..store._twins import Core, Do, Local, Sleep, arun, run
from ..store.clients import Clients
from ..store.durable import durability as _durability
from ..store.durable import named as _named
from ..store.durable import unconfirmed as _unconfirmed
from ..store.durable import write_async as _write_async
from ..store.durable import write_sync as _write_sync
from ..store.scripts import arun_pipeline, run_pipeline
from ..tasks.errors import CampaignClosed, EnqueueError, NotReplicated, QuotaExceeded
from . import tracked
from .chunks import CHUNK, WINDOW, GroupFn, KeyFn, Stream, Window
from .chunks import quota_checked as _quota_checked
from .chunks import quota_error as _quota_error
from .options import MAX_DELAY_S, Call, EnqueueOptions, call, eta_seconds
from .plan import Plan, plan
from .seqs import SeqSource, areserve

__all__ = ["CHUNK", "MAX_DELAY_S", "WINDOW", "Call", "EnqueueOptions", "GroupFn", "KeyFn",
           "aenqueue",
           "aenqueue_many", "call", "enqueue", "enqueue_many", "eta_seconds", "plan"]

RETRY_DELAYS_S = (0.05, 0.2, 0.5, 1.0, 2.0)
"""Backoff between tries of a write whose connection failed (about 4 s in all)."""

SENTINEL_RETRY_DELAYS_S = (*RETRY_DELAYS_S, *(2.0,) * 8)
"""The same behind Sentinels (about 20 s, each pause jittered by +-25 %): no primary is
known until the Sentinels agree the old one is down (``down-after-milliseconds``) and
promote a replica, and a fleet of producers should not ask them in step."""

_RETRY_WRITE_ERRORS = (redis.ConnectionError, redis.TimeoutError, redis.exceptions.TryAgainError,
                redis.exceptions.ClusterError, RuntimeError)
"""Errors after which a write is retried (in check mode): a lost connection (under uvloop
a write to a reset connection raises RuntimeError), or a Redis Cluster slot moving (the
script did not run)."""


# --- the retry loop: one core, two shells ----------------------------------------------


def _tries(c: Clients, p: Plan, entries: list[bytes]
           ) -> Iterator[tuple[float, list[str], list[Any]]]:
    """The tries of one write: (pause before it, keys, args). Every try after the first
    is in check mode, so a try whose reply was lost is not written twice."""
    sentinel = c.settings.sentinel
    for attempt, pause in enumerate((0.0, *(SENTINEL_RETRY_DELAYS_S if sentinel
                                            else RETRY_DELAYS_S))):
        keys, args = p.script_args(entries, check=attempt > 0)
        yield pause * random.uniform(0.75, 1.25) if sentinel else pause, keys, args


def _refused(p: Plan, exc: redis.ResponseError) -> EnqueueError:
    return EnqueueError(f"Redis refused to enqueue {p.task}: {exc}", written=0)


def _unreachable(p: Plan, last: BaseException | None, n: int) -> EnqueueError:
    return EnqueueError(f"cannot reach Redis to enqueue {p.task}: {last}", unknown=n)


def _with_retry(c: Clients, p: Plan, entries: list[bytes]) -> Core[Any]:
    """One write, retried in check mode while the connection fails."""
    last: BaseException | None = None
    for pause, keys, args in _tries(c, p, entries):
        if pause:
            yield Sleep(pause)
        try:
            yield from c.registering(p.keys.queue)  # once per process; retried like the write
            return _quota_checked(p, (yield Do(_write_sync, _write_async, c, p, keys, args)))
        except _RETRY_WRITE_ERRORS as exc:
            last = exc
        except redis.ResponseError as exc:  # e.g. OOM: the script did not run
            raise _refused(p, exc) from exc
    raise _unreachable(p, last, len(entries)) from last


def _write_tracked(c: Clients, p: Plan, ids: list[str], entries: list[bytes]
                   ) -> Core[list[str]]:
    """One tracked write (joining the campaign to the queue first, once per process;
    tracked jobs skip the ``aenqueue`` coalescer)."""
    for again in (False, True):
        closed = None
        if p.campaign is not None:
            closed = yield from tracked.joining(c, p.campaign, p.keys.queue,
                                                keyed=tracked.keyed(entries))
        try:
            return tracked.ids_of(p.campaign, ids, (yield from _with_retry(c, p, entries)),
                                  closed)
        except NotReplicated as exc:
            raise _named(exc, ids) from None
        except tracked.NotJoined:
            tracked.forget(c, p.campaign or "", p.keys.queue)
            if again:
                raise CampaignClosed(p.campaign or "", f"campaign {p.campaign!r} is not "
                                     f"open on queue {p.keys.queue!r}") from None
    raise AssertionError("unreachable")


def _prepare(c: Clients, rest: Window) -> Core[dict[str, CampaignClosed]]:
    """Before a pipelined window: register each shard it writes to (and join a campaign
    to it), once per process, as the single call does for its own queue. Returns, by
    queue, a closed campaign that may still answer held keys (``tracked.join``)."""
    closed = {}
    for cp in {cp.keys.queue: cp for cp, _, _ in rest}.values():
        yield from c.registering(cp.keys.queue)
        if cp.campaign is not None:
            shut = yield from tracked.joining(c, cp.campaign, cp.keys.queue,
                                              keyed=_keyed(rest, cp.keys.queue))
            if shut is not None:
                closed[cp.keys.queue] = shut
    return closed


def _keyed(rest: Window, queue: str) -> bool:
    return all(tracked.keyed(entries) for cp, _, entries in rest if cp.keys.queue == queue)


class _Flush(Local):
    """Record the window on the wire, if any (the sync shell has one in flight)."""

    __slots__ = ()


class _Send(Local):
    """Write a pipelined window (``closed``: from ``_prepare``)."""

    __slots__ = ("closed", "rest")

    def __init__(self, rest: Window, closed: dict[str, CampaignClosed]) -> None:
        self.rest, self.closed = rest, closed


_FLUSH = _Flush()


def _many(c: Clients, st: Stream, items: Iterable[Any]) -> Core[list[str]]:
    """The core of ``enqueue_many`` / ``aenqueue_many``: each window's single call goes
    through ``_with_retry`` here, its pipelined rest to the shell (``_Send``)."""
    steps = st.steps(items)
    while True:
        try:
            step = next(steps, None)  # encodes while the previous window is on the wire
        except (TypeError, ValueError) as exc:  # an item that cannot be encoded
            yield _FLUSH
            exc.written = len(st.written)  # type: ignore[union-attr]
            raise
        yield _FLUSH
        if step is None:
            return st.written
        single, rest = step
        if single is not None:
            sp, chunk_ids = single[0], single[1]
            try:
                if sp.tracked:
                    st.tracked(chunk_ids, (yield from _write_tracked(c, sp, *single[1:])))
                else:
                    yield from _with_retry(c, sp, single[2])
                    st.written.extend(chunk_ids)
            except NotReplicated as exc:
                raise _named(exc, chunk_ids, st.written) from None
            except QuotaExceeded as exc:
                raise _quota_error(sp, exc.group, st.written) from None
            except EnqueueError as exc:
                raise st.failed(exc) from exc.__cause__
        if rest:
            yield _Send(rest, (yield from _prepare(c, rest)))


# --- sync ------------------------------------------------------------------------------


def enqueue(c: Clients, p: Plan, args: Any, kwargs: Mapping[str, Any],
            key: str | None = None) -> str:
    if c.otel is not None:  # traced (batchq.ops.otel): the same write, in a send span
        with c.otel.send(p) as sent:
            return sent.one(_enqueue(c, p, args, kwargs, key))
    return _enqueue(c, p, args, kwargs, key)


def _enqueue(c: Clients, p: Plan, args: Any, kwargs: Mapping[str, Any],
             key: str | None = None) -> str:
    jid, e = p.entry(args, kwargs, int(time.time() * 1000),
                     SeqSource(c, p.keys) if p.due is None else None)
    return run(_one(c, p, jid, e, key))


def _one(c: Clients, p: Plan, jid: str, e: bytes, key: str | None) -> Core[str]:
    """The write of one job, ``enqueue`` / ``aenqueue`` (plain jobs of asyncio code go
    through the coalescer, tracked ones never)."""
    if p.tracked:
        return (yield from _write_tracked(c, p, [jid], [e, (key or "").encode()]))[0]
    try:
        yield Do(_put, _aput, c, p, e)
    except NotReplicated as exc:
        raise _named(exc, [jid]) from None
    return jid


def _put(c: Clients, p: Plan, e: bytes) -> None:
    run(_with_retry(c, p, [e]))


class _InFlight:
    """At most one pipelined window on the wire, sent by a helper thread: the caller
    encodes the next window meanwhile (Redis runs window N while Python encodes N+1).
    Windows are still written one after another, in order, and each is recorded before
    the next is sent, so ``written`` / ``ids`` stay exact."""

    def __init__(self) -> None:
        self._pool: ThreadPoolExecutor | None = None
        self._job: tuple[Window, Future[tuple[list[Any], int]]] | None = None
        self._closed: dict[str, CampaignClosed] = {}
        self._durable: tuple[Clients, replicas.Durability] | None = None

    def send(self, c: Clients, rest: Window, closed: dict[str, CampaignClosed]) -> None:
        self._closed = closed
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="batchq-enqueue")
        d = _durability(c, rest[0][0])
        if d.min_replicas:  # the window and a WAIT on one connection
            self._durable = c, d
            items: list[replicas.Item] = []
            for cp, _, entries in rest:
                keys, args = cp.script_args(entries, check=False)
                items.append((c.sync_scripts.by_name[cp.script], keys, args))
            self._job = rest, self._pool.submit(replicas.run_sync, c.redis, items, d)
            return
        pipe = c.redis.pipeline(transaction=False)
        for cp, _, entries in rest:
            keys, args = cp.script_args(entries, check=False)
            c.sync_scripts.by_name[cp.script](keys, args, client=pipe)
        self._job = rest, self._pool.submit(_unwaited, pipe, c.redis)

    def wait(self, st: Stream) -> None:
        """Record the window on the wire, if any (``EnqueueError`` if it failed)."""
        if self._job is None:
            return
        rest, fut = self._job
        self._job = None
        try:
            results, acked = fut.result()
        except _RETRY_WRITE_ERRORS as exc:
            raise st.lost(rest, exc) from exc
        before = len(st.written)
        st.record(rest, results, self._closed)
        if self._durable is not None and acked < self._durable[1].min_replicas:
            c, d = self._durable
            short = _unconfirmed(rest[0][0], d, acked, replicas.replicas_present(c.redis))
            raise _named(short, st.written[before:], st.written[:before])

    def close(self) -> None:
        """Let a window still on the wire finish (its jobs are then in Redis, unrecorded:
        only when the caller is raising another exception), and stop the thread."""
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None


def _unwaited(pipe: Any, client: redis.Redis) -> tuple[list[Any], int]:
    """``run_pipeline`` without replicas to wait for (0 confirmed, none wanted)."""
    return run_pipeline(pipe, client), 0


def enqueue_many(c: Clients, p: Plan, items: Iterable[Any],
                 key_fn: KeyFn | None = None, spread: list[Plan] | None = None,
                 group_fn: GroupFn | None = None) -> list[str]:
    if c.otel is not None:  # traced (batchq.ops.otel): the same writes, in one send span
        with c.otel.send(p) as sent:
            return sent.many(_enqueue_many(c, p, items, key_fn, spread, group_fn))
    return _enqueue_many(c, p, items, key_fn, spread, group_fn)


def _enqueue_many(c: Clients, p: Plan, items: Iterable[Any],
                  key_fn: KeyFn | None = None, spread: list[Plan] | None = None,
                  group_fn: GroupFn | None = None) -> list[str]:
    """``spread``: the plans of a sharded queue's shards, written to chunk by chunk in
    turn (``p`` is then ignored); ``group_fn``: each row's group (``chunks.Stream``)."""
    plans = spread or [p]
    st = Stream([(x, SeqSource(c, x.keys, want=CHUNK)) for x in plans], key_fn, group_fn)
    flight = _InFlight()

    def on(op: Local) -> None:
        if isinstance(op, _Send):
            flight.send(c, op.rest, op.closed)
        else:
            flight.wait(st)

    try:
        return run(_many(c, st, items), on)
    finally:
        flight.close()


# --- asyncio ---------------------------------------------------------------------------


class Coalescer:
    """Concurrent ``aenqueue`` calls of one event loop share script calls.

    The first call for a target (queue, priority, delay) writes its job at once itself;
    calls that arrive while it is on the wire wait for the next one and go together, up to
    ``CHUNK`` jobs per script call. Many coroutines enqueueing one job each then cost one
    round trip per batch instead of one each, with no added latency for a lone caller.
    """

    def __init__(self) -> None:
        self._pending: dict[Plan, tuple[list[bytes], list[asyncio.Future[None]]]] = {}
        self._busy: set[Plan] = set()

    async def submit(self, c: Clients, p: Plan, entry: bytes) -> None:
        if p not in self._busy:
            # a lone caller writes its own job, with no hop through a task and a future
            # (two loop turns fewer); calls that arrive meanwhile queue up, and a drain
            # takes them as soon as this write is done (or was cancelled)
            self._busy.add(p)
            try:
                await arun(_with_retry(c, p, [entry]))
            finally:
                if p in self._pending:
                    asyncio.get_running_loop().create_task(self._drain(c, p))
                else:
                    self._busy.discard(p)
            return
        # a write of this target is on the wire: its caller (or its drain) starts a
        # drain for this one once it is done
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        slot = self._pending.get(p)
        if slot is None:
            self._pending[p] = ([entry], [fut])
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
                        await arun(_with_retry(c, p, entries[i : i + CHUNK]))
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
    if isinstance(exc, NotReplicated):
        copy = NotReplicated(str(exc), ids=[], confirmed=exc.confirmed, wanted=exc.wanted)
        copy.__cause__ = exc.__cause__
        return copy
    if isinstance(exc, EnqueueError):
        note = f" (one script call carried {shared_by} jobs)" if shared_by > 1 else ""
        own = EnqueueError(f"{exc}{note}", unknown=1 if exc.unknown else 0)
        own.__cause__ = exc.__cause__
        return own
    return exc


async def aenqueue(c: Clients, p: Plan, args: Any, kwargs: Mapping[str, Any],
                   key: str | None = None) -> str:
    if c.otel is not None:  # traced (batchq.ops.otel): the same write, in a send span
        with c.otel.send(p) as sent:
            return sent.one(await _aenqueue(c, p, args, kwargs, key))
    return await _aenqueue(c, p, args, kwargs, key)


async def _aenqueue(c: Clients, p: Plan, args: Any, kwargs: Mapping[str, Any],
                    key: str | None = None) -> str:
    body = p.body(args, kwargs, int(time.time() * 1000))  # a bad job reserves nothing
    runs = await areserve(c, p.keys, 1) if p.due is None else []
    jid, e = p.finish(body, SeqSource(c, p.keys, runs))
    return await arun(_one(c, p, jid, e, key))


async def _aput(c: Clients, p: Plan, e: bytes) -> None:
    await coalescer(c).submit(c, p, e)


async def aenqueue_many(c: Clients, p: Plan, items: Iterable[Any],
                        key_fn: KeyFn | None = None, spread: list[Plan] | None = None,
                        group_fn: GroupFn | None = None) -> list[str]:
    if c.otel is not None:  # traced (batchq.ops.otel): the same writes, in one send span
        with c.otel.send(p) as sent:
            return sent.many(await _aenqueue_many(c, p, items, key_fn, spread, group_fn))
    return await _aenqueue_many(c, p, items, key_fn, spread, group_fn)


async def _aenqueue_many(c: Clients, p: Plan, items: Iterable[Any],
                         key_fn: KeyFn | None = None, spread: list[Plan] | None = None,
                         group_fn: GroupFn | None = None) -> list[str]:
    items = list(items)  # its length: the sequence numbers are reserved up front
    plans = spread or [p]
    n_chunks = -(-len(items) // CHUNK)
    sources = []
    for i, x in enumerate(plans):
        # the jobs of the chunks this shard gets (chunk j goes to shard j mod n)
        mine = sum(min(CHUNK, len(items) - j * CHUNK) for j in range(i, n_chunks, len(plans)))
        sources.append((x, SeqSource(c, x.keys, await areserve(c, x.keys, mine)
                                     if mine else [])))
    st = Stream(sources, key_fn, group_fn)

    async def on(op: Local) -> None:
        if isinstance(op, _Send):
            await _send_async(c, st, op.rest, op.closed)

    return await arun(_many(c, st, items), on)


async def _send_async(c: Clients, st: Stream, rest: Window,
                      closed: dict[str, CampaignClosed]) -> None:
    """One pipelined window over the running loop's client, recorded at once."""
    scripts = c.async_scripts()
    d = _durability(c, rest[0][0])
    pipe = c.async_redis().pipeline(transaction=False)
    calls: list[replicas.Item] = []
    for cp, _, entries in rest:
        keys, args = cp.script_args(entries, check=False)
        if d.min_replicas:
            calls.append((scripts.by_name[cp.script], keys, args))
        else:
            await scripts.by_name[cp.script](keys, args, client=pipe)
    try:
        if d.min_replicas:
            results, acked = await replicas.run_async(c.async_redis(), calls, d)
        else:
            results, acked = await arun_pipeline(pipe, c.async_redis()), 0
    except _RETRY_WRITE_ERRORS as exc:
        raise st.lost(rest, exc) from exc
    before = len(st.written)
    st.record(rest, results, closed)
    if acked < d.min_replicas:
        short = _unconfirmed(rest[0][0], d, acked,
                             await replicas.areplicas_present(c.async_redis()))
        raise _named(short, st.written[before:], st.written[:before])
