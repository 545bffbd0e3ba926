"""Results, status and cancel: what became of a job, by its id alone.

A job id starts with its queue's reference (``codec.queue_ref``), so the id leads to the
queue's keys (on a Cluster: to its slot) without a scan: the reference is looked up in
this process's map of queue names (the app's tasks, then the namespace's registry of
queues, ``SMEMBERS`` once per unknown reference). Two queues that share a reference are
both asked.

* ``job_status``: one ``status.lua`` call (the pending index, inflight, the result key,
  the dead store, the cancelled records), atomic.
* ``cancel``: one ``cancel.lua`` call; a cancelled ready job is dropped by ``pop.lua``.
* ``result`` / ``aresult``: wait without polling. Each process has one listener thread
  with one pub/sub connection (``Listener``); a waiter subscribes to the job's channel
  ``<done>:<id>`` (one subscription per job id per process, however many waiters),
  waits for the subscription to be confirmed, and only then reads the state (so a job
  that ends in between is not missed, bullmq#383). ``ack_result.lua``, ``nack.lua``,
  ``pop.lua`` and ``cancel.lua`` publish on the channel when the job ends; the waiter
  reads the state again. A lost pub/sub connection is re-made and every waiter reads
  again, since a message may have been lost meanwhile. A plain ack announces nothing:
  a job of tasks without ``result_ttl_s`` is refused at once (``ResultNotKept``), one
  that may be either is read every ``MAYBE_PLAIN_RECHECK_S``; and once at the deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
import time
import weakref
from collections.abc import Callable, Iterable
from typing import Any, Protocol

import redis

from ..store import codec
from ..store._twins import Command, Core, Local, Script, arun, run
from ..store.clients import Clients
from ..store.connection import plain_url
from ..store.keys import MAX_SHARDS, QueueKeys, queues_key, shard_name, shards_key, split_shard
from ..store.scripts import calls
from .durations import check_seconds
from .errors import JobCancelled, JobDead, JobExpired, ResultNotKept

log = logging.getLogger("batchq.results")

STATES = ("ready", "delayed", "reserved", "succeeded", "dead", "cancelled", "expired", "unknown")

CANCEL_KEEP_S = 86400.0
"""How long ``job_status`` reports "cancelled" after a cancel (cancel.lua trims)."""

CANCEL_TRIM_CHUNK = 100
"""Old cancelled records removed per ``cancel.lua`` call at most."""

_FINAL = ("succeeded", "dead", "cancelled", "expired", "unknown")


class ResultsOwner(Protocol):
    """What the functions here need of an app (``App`` is one)."""

    @property
    def clients(self) -> Clients: ...

    def queues(self) -> list[str]: ...


def _check_id(job_id: object) -> str:
    if not isinstance(job_id, str) or not job_id or any(c in job_id for c in ": \t\r\n{}"):
        raise ValueError(f"invalid job id {job_id!r}")
    return job_id


# --- job id -> queue -------------------------------------------------------------------

_refs: weakref.WeakKeyDictionary[Clients, dict[str, set[str]]] = weakref.WeakKeyDictionary()


def _add(table: dict[str, set[str]], names: Iterable[Any]) -> None:
    for raw in names:
        name = raw.decode("utf-8", "surrogateescape") if isinstance(raw, bytes) else str(raw)
        table.setdefault(codec.queue_ref(name), set()).add(name)


def candidates(app: ResultsOwner, job_id: str) -> list[QueueKeys]:
    """The queues ``job_id`` may belong to (usually one; none for an unknown reference)."""
    return run(_candidates(app, job_id))


async def acandidates(app: ResultsOwner, job_id: str) -> list[QueueKeys]:
    return await arun(_candidates(app, job_id))


def _candidates(app: ResultsOwner, job_id: str) -> Core[list[QueueKeys]]:
    c = app.clients
    table = _refs.get(c)
    if table is None:
        table = _refs[c] = {}
        _add(table, app.queues())
    ref = codec.ref_of(job_id)
    if ref not in table:
        _add(table, (yield Command(c, "smembers", queues_key(c.namespace))))
        _add(table, _shard_names(c, (yield Command(c, "zrange", shards_key(c.namespace), 0, -1,
                                                   withscores=True))))
    return [c.keys(q) for q in sorted(table.get(ref, ()))]


def _shard_names(c: Clients, registered: Iterable[Any]) -> list[str]:
    """Every shard name of the sharded queues (registered or configured here): a job id
    leads to its shard."""
    counts = dict(c.shards.counts)
    for raw, score in registered:
        name = raw.decode("utf-8", "surrogateescape") if isinstance(raw, bytes) else str(raw)
        counts[name] = max(counts.get(name, 1), min(MAX_SHARDS, int(score)))
    out: list[str] = []
    for base, n in counts.items():
        with contextlib.suppress(ValueError):
            out += [shard_name(base, k) for k in range(1, n) if split_shard(base)[1] == 0]
    return out


# --- status and cancel -----------------------------------------------------------------


def _state(reply: list[Any]) -> tuple[str, bytes | None]:
    state = reply[0].decode() if isinstance(reply[0], bytes) else str(reply[0])
    return state, (reply[1] if len(reply) > 1 else None)


def read_state(app: ResultsOwner, job_id: str, *, payload: bool = False
               ) -> tuple[str, bytes | None, QueueKeys | None]:
    """(state, result or dead record, queue) of ``job_id``."""
    return run(_read_state(app, job_id, payload))


async def aread_state(app: ResultsOwner, job_id: str, *, payload: bool = False
                      ) -> tuple[str, bytes | None, QueueKeys | None]:
    return await arun(_read_state(app, job_id, payload))


def _read_state(app: ResultsOwner, job_id: str, payload: bool
                ) -> Core[tuple[str, bytes | None, QueueKeys | None]]:
    for k in (yield from _candidates(app, job_id)):
        state, data = _state((yield Script(app.clients,
                                           calls.status(k, job_id, payload=payload))))
        if state != "unknown":
            return state, data, k
    return "unknown", None, None


def job_status(app: ResultsOwner, job_id: str) -> str:
    """One of ``STATES``; see ``App.job_status``."""
    return read_state(app, _check_id(job_id))[0]


def cancel(app: ResultsOwner, job_id: str) -> bool:
    """See ``App.cancel``."""
    return run(_cancelling(app, job_id))


async def acancel(app: ResultsOwner, job_id: str) -> bool:
    return await arun(_cancelling(app, job_id))


def _cancelling(app: ResultsOwner, job_id: str) -> Core[bool]:
    _check_id(job_id)
    for k in (yield from _candidates(app, job_id)):
        if (yield Script(app.clients, calls.cancel(k, job_id, round(CANCEL_KEEP_S * 1000),
                                                   CANCEL_TRIM_CHUNK))) == 1:
            return True
    return False


def _outcome(job_id: str, state: str, data: bytes | None) -> Any:
    """The value of a finished job, or the error that says why there is none."""
    if state == "succeeded" and data is not None:
        return codec.decode_result(data)
    if state == "dead":
        raise JobDead(job_id, codec.decode_dead_record(data or b""))
    if state in ("cancelled", "expired"):
        raise (JobCancelled if state == "cancelled" else JobExpired)(job_id)
    raise KeyError(f"no job {job_id!r} (unknown, or its result expired or was never kept: "
                   "only tasks with result_ttl_s keep one)")


# --- the listener ----------------------------------------------------------------------


class _Channel:
    __slots__ = ("armed_at", "confirmed", "futures", "refs", "sent", "version")

    def __init__(self) -> None:
        self.refs = 0
        self.sent = 0  # SUBSCRIBEs sent for it on the current connection
        self.confirmed = 0  # their confirmations received
        self.armed_at = 0  # the SUBSCRIBE whose confirmation arms the current waiters
        self.version = 0  # bumped on every message (or a reconnect): waiters read again
        self.futures: set[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = set()

    @property
    def armed(self) -> bool:
        return self.confirmed >= self.armed_at > 0


class Listener:
    """One pub/sub connection per process, read by a daemon thread; waiters of every
    thread and event loop share it (one subscription per channel)."""

    def __init__(self, url: str) -> None:
        # a plain client even on a Cluster: PUBLISH reaches every node, so any node serves
        self._client = redis.Redis.from_url(plain_url(url), socket_timeout=None,
                                            socket_connect_timeout=10)
        self._conn: Any = None
        self._cond = threading.Condition()
        self._send = threading.Lock()
        self._channels: dict[bytes, _Channel] = {}
        self._thread = threading.Thread(target=self._run, name="batchq-results",
                                        daemon=True)
        self._ready = threading.Event()
        self._thread.start()

    # -- used by waiters --

    def subscribe(self, channel: bytes) -> _Channel:
        self._ready.wait(30)
        with self._cond:
            ch = self._channels.get(channel)
            if ch is None:
                ch = self._channels[channel] = _Channel()
            ch.refs += 1
            if ch.refs == 1 or not ch.armed_at:
                ch.sent += 1
                ch.armed_at = ch.sent
                self._send_command("SUBSCRIBE", channel)
        return ch

    def unsubscribe(self, channel: bytes, ch: _Channel) -> None:
        with self._cond:
            ch.refs -= 1
            if ch.refs == 0:
                ch.armed_at = 0
                self._send_command("UNSUBSCRIBE", channel)

    def wait(self, chans: list[_Channel], seen: list[int], deadline: float) -> bool:
        """Block until one of ``chans`` changed since ``seen`` (its versions); False at
        the deadline (monotonic)."""
        with self._cond:
            return self._cond.wait_for(
                lambda: any(ch.version > v for ch, v in zip(chans, seen, strict=True)),
                max(0.0, deadline - time.monotonic()))

    def wait_armed(self, ch: _Channel, deadline: float) -> bool:
        with self._cond:
            return self._cond.wait_for(lambda: ch.armed, max(0.0, deadline - time.monotonic()))

    def future(self, ch: _Channel) -> asyncio.Future[None]:
        """A future of the running loop, resolved at the next change of ``ch``."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        with self._cond:
            ch.futures.add((loop, fut))
        return fut

    def drop_future(self, ch: _Channel, fut: asyncio.Future[None]) -> None:
        with self._cond:
            ch.futures = {(lp, f) for lp, f in ch.futures if f is not fut}

    # -- the thread --

    def _send_command(self, *args: Any) -> None:
        with self._send:
            if self._conn is None:
                return  # not connected: the reconnect subscribes every channel
            # on failure the reader sees the broken connection and re-subscribes
            with contextlib.suppress(redis.RedisError, OSError):
                self._conn.send_command(*args)

    def _notify(self, ch: _Channel) -> None:
        ch.version += 1
        for loop, fut in ch.futures:
            with contextlib.suppress(RuntimeError):  # a closed loop
                loop.call_soon_threadsafe(_resolve, fut)
        ch.futures = set()
        self._cond.notify_all()

    def _connect(self) -> None:
        conn: Any = self._client.connection_pool.make_connection()
        conn.connect()
        with self._cond, self._send:
            self._conn = conn
            for name, ch in self._channels.items():
                ch.sent, ch.confirmed = 0, 0
                if ch.refs > 0:
                    ch.sent = 1
                    ch.armed_at = 1
                    conn.send_command("SUBSCRIBE", name)
                    # a message may have been lost meanwhile: every waiter reads again
                    self._notify(ch)
        self._ready.set()

    def _run(self) -> None:
        pause = 0.1
        while True:
            try:
                self._connect()
                pause = 0.1
                while True:
                    self._handle(self._conn.read_response(push_request=True))
            except Exception as exc:
                log.warning("result listener connection lost (%s); reconnecting", exc)
                with self._send:
                    if self._conn is not None:
                        with contextlib.suppress(Exception):
                            self._conn.disconnect()
                    self._conn = None
                time.sleep(pause)
                pause = min(5.0, pause * 2)

    def _handle(self, msg: Any) -> None:
        if not isinstance(msg, list) or len(msg) < 3:
            return
        kind, name = msg[0], msg[1]
        with self._cond:
            ch = self._channels.get(name)
            if ch is None:
                return
            if kind == b"subscribe":
                ch.confirmed += 1
                self._notify(ch)
            elif kind == b"message":
                self._notify(ch)
            elif kind == b"unsubscribe" and ch.refs == 0 and ch.confirmed >= ch.sent:
                del self._channels[name]


def _resolve(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


WAITERS_TTL_MS = 30_000
"""A waiter keeps its queue's ``waiters`` flag alive this long; ack_result.lua publishes
only while the flag exists (a drain nobody waits on skips the PUBLISH per job)."""
WAITERS_RENEW_S = 10.0
"""A waiter renews the flag (and reads the job's state again) this often."""
MAYBE_PLAIN_RECHECK_S = 0.5
"""A waiter whose job may belong to a task without ``result_ttl_s`` (its app registers
tasks of both kinds on the queue, or none) reads the state this often: such a job's ack
announces nothing."""

_listeners: dict[tuple[int, str], Listener] = {}
_listeners_lock = threading.Lock()


def listener(c: Clients) -> Listener:
    """This process's listener for ``c``'s Redis (made on first use; a forked child
    makes its own)."""
    key = (os.getpid(), c.settings.url)
    with _listeners_lock:
        lst = _listeners.get(key)
        if lst is None:
            lst = _listeners[key] = Listener(c.settings.url)
        return lst


# --- waiting ---------------------------------------------------------------------------


def keeps_results(app: ResultsOwner, ks: list[QueueKeys]) -> bool | None:
    """Whether a job of the queues ``ks`` keeps its result: True when every task of the
    app there does, False when none does, None when unsure (some, or no task there)."""
    bases = {split_shard(k.queue)[0] for k in ks}  # the candidates' names are valid
    kept = {t.result_ttl_ms is not None for t in getattr(app, "tasks", {}).values()
            if split_shard(t.config.queue)[0] in bases}
    return kept.pop() if len(kept) == 1 else None


def _not_kept(job_id: str, state: str, data: bytes | None, ks: list[QueueKeys]) -> Any:
    """A job of tasks that keep no result: its outcome when dead or cancelled, else
    ``ResultNotKept`` at once (there is nothing to wait for)."""
    if state in ("dead", "cancelled", "expired", "succeeded"):
        return _outcome(job_id, state, data)
    where = ", ".join(repr(k.queue) for k in ks)
    now = "unknown (finished, or never enqueued)" if state == "unknown" else state
    raise ResultNotKept(job_id, f"job {job_id} is {now}: the tasks of queue {where} keep "
                        "no result (no result_ttl_s), so app.result has nothing to wait "
                        "for; give the task result_ttl_s, or ask app.job_status", state)


class _Listen(Local):
    """The listener's part, done by each shell its own way: ``subscribe`` to the channels
    (True once all are confirmed by ``at``), ``mark`` their state (a message from then
    on ends the next wait), ``wait`` for such a message until ``at``."""

    __slots__ = ("at", "kind", "names")

    def __init__(self, kind: str, at: float = 0.0, names: list[bytes] | None = None) -> None:
        self.kind, self.at, self.names = kind, at, names or []


def _result(app: ResultsOwner, job_id: str, timeout_s: float,
            clock: Callable[[], float]) -> Core[Any]:
    """The core of ``result`` / ``aresult`` (``clock``: monotonic, the shell's)."""
    _check_id(job_id)
    deadline = clock() + check_seconds("timeout_s", timeout_s)
    ks = yield from _candidates(app, job_id)
    if not ks:
        raise KeyError(f"no job {job_id!r} (its id names no queue of this namespace)")
    keeps = keeps_results(app, ks)
    if keeps is False:
        state, data, _ = yield from _read_state(app, job_id, True)
        return _not_kept(job_id, state, data, ks)
    if not (yield _Listen("subscribe", deadline, [k.done_channel(job_id).encode()
                                                   for k in ks])):
        raise TimeoutError(f"job {job_id}: could not subscribe in time")
    while True:
        yield _Listen("mark")  # before the read: a change after it wakes this waiter
        for k in ks:  # before the read: an ack after it publishes (see WAITERS_TTL_MS)
            yield Command(app.clients, "set", k.waiters, b"1", px=WAITERS_TTL_MS)
        state, data, _ = yield from _read_state(app, job_id, True)
        if state in _FINAL:
            return _outcome(job_id, state, data)
        # the state was read after the deadline passed: a job settled meanwhile is
        # returned above, never reported as still waiting
        if clock() >= deadline:
            raise TimeoutError(f"job {job_id} is still {state} after {timeout_s}s")
        # a message on a candidate channel wakes us; else the flag is renewed (and
        # the state read) every step: a plain ack announces nothing
        step_s = WAITERS_RENEW_S if keeps else MAYBE_PLAIN_RECHECK_S
        yield _Listen("wait", min(deadline, clock() + step_s))


def result(app: ResultsOwner, job_id: str, timeout_s: float) -> Any:
    """See ``App.result``."""
    subs: list[tuple[bytes, _Channel]] = []
    seen: list[int] = []

    def on(op: Local) -> bool:
        assert isinstance(op, _Listen)
        lst = listener(app.clients)
        if op.kind == "subscribe":
            subs.extend((name, lst.subscribe(name)) for name in op.names)
            return all(lst.wait_armed(ch, op.at) for _, ch in subs)
        if op.kind == "mark":
            seen[:] = [ch.version for _, ch in subs]
            return True
        return lst.wait([ch for _, ch in subs], seen, op.at)

    try:
        return run(_result(app, job_id, timeout_s, time.monotonic), on)
    finally:
        for name, ch in subs:
            listener(app.clients).unsubscribe(name, ch)


async def aresult(app: ResultsOwner, job_id: str, timeout_s: float) -> Any:
    """See ``App.aresult``."""
    loop = asyncio.get_running_loop()
    subs: list[tuple[bytes, _Channel]] = []
    futs: list[tuple[_Channel, asyncio.Future[None]]] = []

    def drop() -> None:
        for ch, fut in futs:
            listener(app.clients).drop_future(ch, fut)
        futs.clear()

    def watch(lst: Listener) -> bool:  # futures first: a change after this wakes us
        drop()
        futs.extend((ch, lst.future(ch)) for _, ch in subs)
        return all(ch.armed for _, ch in subs)

    async def on(op: Local) -> bool:
        assert isinstance(op, _Listen)
        if op.kind == "subscribe":  # made in a thread: the first one connects
            lst = await loop.run_in_executor(None, listener, app.clients)
            subs.extend((name, lst.subscribe(name)) for name in op.names)
            while not watch(lst):
                if not await _wait_any(futs, op.at, loop):
                    return False
            return True
        if op.kind == "mark":
            return watch(listener(app.clients))
        return await _wait_any(futs, op.at, loop)

    try:
        return await arun(_result(app, job_id, timeout_s, loop.time), on)
    finally:
        drop()
        for name, ch in subs:
            listener(app.clients).unsubscribe(name, ch)


async def _wait_any(futs: list[tuple[_Channel, asyncio.Future[None]]], deadline: float,
                    loop: asyncio.AbstractEventLoop) -> bool:
    """True when one of the futures resolved before the deadline (loop time)."""
    done, _ = await asyncio.wait([f for _, f in futs],
                                 timeout=max(0.0, deadline - loop.time()),
                                 return_when=asyncio.FIRST_COMPLETED)
    return bool(done)
