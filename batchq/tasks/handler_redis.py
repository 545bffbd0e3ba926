"""``batchq.BatchingRedis``: the handlers' way to touch Redis, the commands of every job
in flight in one process sent together.

A worker runs up to ``-c`` jobs at once on one event loop. When each of them sends its
own pipeline on a ``redis.asyncio`` client, the client costs more CPU than batchq spends
on the job (a task and a timeout per send, a connection and a parser call per reply). A
``BatchingRedis`` made once at import (``r = batchq.BatchingRedis(url)``) instead keeps,
per process and event loop, one connection of its own and a list of the commands
awaited on that loop: the commands that arrived during one turn of the loop are packed
(hiredis), written in one ``write`` and their replies parsed (hiredis) as they arrive, in
the protocol's callback, each reply handed to the future of the job that sent it. While
a batch is on the wire the next one fills, and is sent when that reply is in (one batch
in flight per connection, at most ``max_batch`` commands in it).

* **Fork-safe**: nothing is connected until a command is sent, and a process that is
  not the one that connected (a pre-forked worker) forgets its parent's connections
  without touching them.
* **Errors go to their caller**: an error reply raises ``redis.ResponseError`` (or its
  redis-py subclass: ``NoScriptError``, ``ReadOnlyError``, ...) in the job that sent
  that command, and the others of the batch are unaffected. A lost connection, a reply
  not in after ``socket_timeout_s`` or a failed connect raises ``redis.ConnectionError``
  / ``redis.TimeoutError`` in every job whose command was sent on it (whether Redis ran
  it is unknown, as with any client); a job is never left waiting on a dead connection.
  Commands not yet written go out on the next connection. A ``READONLY`` reply (a
  demoted primary after a failover) drops the connection once its batch is in, so the
  next one asks the Sentinels again.
* **Cancellation**: a job cancelled (its timeout) before its command was written sends
  nothing; after, its reply is read and dropped.

The connection is made by redis-py (``RedisSettings.async_client``'s connection class:
TCP, TLS, Unix sockets, ``redis+sentinel://``, ``AUTH`` and ``SELECT`` as for any
batchq client), which then hands its transport over: replies never go through redis-py's
stream reader. Redis Cluster URLs are refused (the commands of many jobs touch many
slots). Replies are raw, as ``execute_command`` without response callbacks: bytes (str
with ``encoding=``), ints, lists, None; ``SET`` replies ``b"OK"``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import weakref
from collections import deque
from typing import Any, Final

import hiredis
import redis.exceptions as rexc

from ..store.connection import RedisSettings, is_cluster_url, redact, resolve_url

__all__ = ["MAX_BATCH", "BatchingRedis"]

MAX_BATCH: Final = 1000
"""Commands written in one batch at most by default (one job's commands are never split)."""

_ERRORS: dict[str, type[rexc.ResponseError]] = {
    "NOSCRIPT": rexc.NoScriptError,
    "READONLY": rexc.ReadOnlyError,
    "EXECABORT": rexc.ExecAbortError,
    "NOPERM": rexc.NoPermissionError,
    "OOM": rexc.OutOfMemoryError,
}


def _reply_error(message: str) -> rexc.ResponseError:
    """An error reply as redis-py raises it (``replyError`` of the hiredis reader)."""
    code, _, rest = message.partition(" ")
    cls = _ERRORS.get(code)
    return cls(rest) if cls is not None else rexc.ResponseError(message)


# one waiting call: its future, how many replies it takes, whether an error reply raises
# (execute_many), the packed commands (until written)
_Entry = tuple["asyncio.Future[Any]", int, bool, bytes]


class _Wire(asyncio.Protocol):
    """One connection's protocol: the calls whose replies are due, in order."""

    def __init__(self, link: _Link, transport: asyncio.Transport, reader: hiredis.Reader,
                 timeout_s: float | None) -> None:
        self.link = link
        self.transport = transport
        self.reader = reader
        self.timeout_s = timeout_s
        self.waiting: deque[_Entry] = deque()
        self.batches: deque[list[float]] = deque()
        """Per batch on the wire: [replies still due, loop time it was written]."""
        self.parts: list[Any] = []
        self.timer: asyncio.TimerHandle | None = None
        self.keep: tuple[Any, ...] = ()
        """redis-py's stream objects of the transport (a StreamWriter collected closes it)."""
        self.closed = False
        self.stale = False
        """A ``READONLY`` reply came: closed once its batch is in."""

    # --- asyncio.Protocol --------------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        reader = self.reader
        reader.feed(data)
        waiting = self.waiting
        batches = self.batches
        while True:
            try:
                reply = reader.gets()
            except Exception as exc:  # a protocol error: nothing after it can be trusted
                self.fail(rexc.InvalidResponse(f"invalid reply from Redis: {exc}"))
                return
            if reply is False:
                return
            if not waiting:
                self.fail(rexc.InvalidResponse("a reply no command waits for"))
                return
            fut, n, raise_on_error, _ = waiting[0]
            if n == 1:
                waiting.popleft()
                if not fut.done():
                    if isinstance(reply, rexc.ResponseError):
                        if isinstance(reply, rexc.ReadOnlyError):
                            self.stale = True
                        fut.set_exception(reply)
                    else:
                        fut.set_result(reply)
            else:
                parts = self.parts
                parts.append(reply)
                if isinstance(reply, rexc.ReadOnlyError):
                    self.stale = True
                if len(parts) == n:
                    waiting.popleft()
                    self.parts = []
                    if not fut.done():
                        _settle_many(fut, parts, raise_on_error)
            batch = batches[0]
            batch[0] -= 1
            if batch[0] == 0:
                batches.popleft()
                if self.stale and not batches:
                    self.fail(rexc.ConnectionError("the server is read-only (READONLY)"))
                    return
                self.link.batch_done(self)

    def connection_lost(self, exc: Exception | None) -> None:
        why = f": {exc}" if exc else ""
        self.fail(rexc.ConnectionError(f"Connection closed by server{why}"))

    # --- the wire ----------------------------------------------------------------------

    def write(self, entries: list[_Entry], data: bytes, replies: int) -> None:
        """Write one batch (``replies`` commands, ``data`` packed)."""
        self.waiting.extend(entries)
        loop = self.link.loop
        self.batches.append([replies, loop.time()])
        self.transport.write(data)
        if self.timer is None and self.timeout_s is not None:
            self.timer = loop.call_later(self.timeout_s, self._check_timeout)

    def _check_timeout(self) -> None:
        self.timer = None
        if not self.batches or self.closed or self.timeout_s is None:
            return
        due = self.batches[0][1] + self.timeout_s
        left = due - self.link.loop.time()
        if left <= 0:
            self.fail(rexc.TimeoutError(
                f"no reply from Redis in {self.timeout_s:g} s (socket_timeout_s)"))
        else:
            self.timer = self.link.loop.call_later(left, self._check_timeout)

    def fail(self, exc: rexc.RedisError) -> None:
        """Close the connection; every call sent on it raises (a copy of) ``exc``."""
        if self.closed:
            return
        self.closed = True
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        self.transport.abort()
        cls, args = type(exc), exc.args
        waiting, self.waiting = self.waiting, deque()
        self.batches.clear()
        for fut, _, _, _ in waiting:
            if not fut.done():
                fut.set_exception(cls(*args))
        self.link.wire_lost(self)


def _settle_many(fut: asyncio.Future[Any], replies: list[Any], raise_on_error: bool) -> None:
    if raise_on_error:
        for reply in replies:
            if isinstance(reply, rexc.ResponseError):
                fut.set_exception(reply)
                return
    fut.set_result(replies)


class _Link:
    """One event loop's side: the calls not written yet, and its connection."""

    def __init__(self, owner: BatchingRedis, loop: asyncio.AbstractEventLoop) -> None:
        self.owner = owner
        self.loop = loop
        self.pending: list[_Entry] = []
        self.wire: _Wire | None = None
        self.connecting: asyncio.Task[None] | None = None
        self.scheduled = False

    def add(self, entry: _Entry) -> None:
        self.pending.append(entry)
        if not self.scheduled:
            self.scheduled = True
            self.loop.call_soon(self.flush)

    def flush(self) -> None:
        """Write the calls pending (the end of the loop turn they were made in, or a
        batch's replies all in)."""
        self.scheduled = False
        wire = self.wire
        if wire is None:
            if self.connecting is None and self.pending:
                self.connecting = self.loop.create_task(self._connect())
            return
        if wire.batches or not self.pending:
            return  # written when the batch on the wire is in
        pending = self.pending
        cap = self.owner.max_batch
        entries: list[_Entry] = []
        chunks: list[bytes] = []
        replies = 0
        taken = 0
        for entry in pending:
            if replies and replies + entry[1] > cap:
                break
            taken += 1
            if entry[0].done():  # cancelled before it was written: nothing to send
                continue
            entries.append(entry)
            chunks.append(entry[3])
            replies += entry[1]
        del pending[:taken]
        if entries:
            wire.write(entries, b"".join(chunks), replies)
            self.owner._round_trips += 1
            self.owner._commands += replies
        elif pending:
            self.flush()

    def batch_done(self, wire: _Wire) -> None:
        if self.pending and wire is self.wire:
            self.flush()

    def wire_lost(self, wire: _Wire) -> None:
        if wire is self.wire:
            self.wire = None
            if self.pending and not self.scheduled:
                self.scheduled = True
                self.loop.call_soon(self.flush)

    async def _connect(self) -> None:
        try:
            self.wire = await self.owner._open(self)
        except Exception as exc:
            pending, self.pending = self.pending, []
            err = (exc if isinstance(exc, rexc.ConnectionError)
                   else rexc.ConnectionError(f"could not connect to Redis: {exc}"))
            for fut, _, _, _ in pending:
                if not fut.done():
                    fut.set_exception(type(err)(*err.args))
        finally:
            self.connecting = None
        self.flush()

    def close(self, why: str) -> None:
        pending, self.pending = self.pending, []
        for fut, _, _, _ in pending:
            if not fut.done():
                fut.set_exception(rexc.ConnectionError(why))
        if self.connecting is not None:
            self.connecting.cancel()
            self.connecting = None
        if self.wire is not None:
            self.wire.fail(rexc.ConnectionError(why))
            self.wire = None


class BatchingRedis:
    """Redis for handlers: ``await r.execute("INCR", key)``; the commands every job of
    this process awaits at once go out together (one connection per process and event
    loop, one write per batch).

    ``url``: any Redis URL batchq takes but a cluster one (default: ``$BATCHQ_REDIS_URL``,
    as for ``App``), a user's own Redis as well as the queue's. ``max_batch``: commands
    in one write at most. ``encoding``: replies decoded to ``str`` (default bytes).
    ``socket_timeout_s``: a batch with no reply in this time fails (its commands raise
    ``redis.TimeoutError``), None waits for ever. ``client_name``: the connection's
    ``CLIENT SETNAME`` (None: unnamed). Make it once, at import: it connects on first
    use, in the process and loop that use it.
    """

    def __init__(self, url: str | None = None, *, max_batch: int = MAX_BATCH,
                 encoding: str | None = None, socket_timeout_s: float | None = 15.0,
                 connect_timeout_s: float = 5.0,
                 client_name: str | None = "batchq:handler") -> None:
        url = resolve_url(url)
        if is_cluster_url(url):
            raise ValueError(f"BatchingRedis does not take a Redis Cluster URL "
                             f"({redact(url)!r}): use redis.asyncio.RedisCluster")
        if max_batch < 1:
            raise ValueError(f"max_batch must be at least 1, got {max_batch}")
        if client_name is not None and (not client_name or " " in client_name):
            raise ValueError(f"client_name must be a word without spaces, got "
                             f"{client_name!r}")
        self._settings = RedisSettings(url, socket_timeout_s=socket_timeout_s or 15.0,
                                       connect_timeout_s=connect_timeout_s)
        self.max_batch = max_batch
        self.encoding = encoding
        self.socket_timeout_s = socket_timeout_s
        self.client_name = client_name
        self._pid = os.getpid()
        self._links: dict[asyncio.AbstractEventLoop, _Link] = {}
        self._last: tuple[asyncio.AbstractEventLoop | None, _Link | None] = (None, None)
        self._round_trips = 0
        self._commands = 0
        _INSTANCES.add(self)

    def __repr__(self) -> str:
        return f"BatchingRedis({redact(self._settings.url)!r})"

    @property
    def url(self) -> str:
        return self._settings.url

    @property
    def round_trips(self) -> int:
        """Batches written by this process so far (each one write and its replies)."""
        self._check_fork()
        return self._round_trips

    @property
    def commands(self) -> int:
        """Commands written by this process so far."""
        self._check_fork()
        return self._commands

    # --- the calls ---------------------------------------------------------------------

    async def execute(self, *command: Any) -> Any:
        """Run one command (``"SET", key, value``) in the loop's next batch: its reply,
        or its error (``redis.ResponseError``) raised."""
        data = hiredis.pack_command(command)
        loop = asyncio.get_running_loop()
        last_loop, link = self._last
        if last_loop is not loop or link is None:
            link = self._link(loop)
        fut = loop.create_future()
        link.add((fut, 1, True, data))
        return await fut

    async def execute_many(self, *commands: tuple[Any, ...] | list[Any],
                           raise_on_error: bool = True) -> list[Any]:
        """Several commands in the same batch, in order (a pipeline without
        ``MULTI``): their replies, as a list. With ``raise_on_error`` the first error
        reply raises (after every reply is in); without it, errors are in the list."""
        if not commands:
            return []
        data = b"".join([hiredis.pack_command(tuple(c)) for c in commands])
        loop = asyncio.get_running_loop()
        last_loop, link = self._last
        if last_loop is not loop or link is None:
            link = self._link(loop)
        fut: asyncio.Future[list[Any]] = loop.create_future()
        link.add((fut, len(commands), raise_on_error, data))
        return await fut

    async def aclose(self) -> None:
        """Close this loop's connection (calls not written yet raise
        ``redis.ConnectionError``); the next call connects again."""
        self._check_fork()
        link = self._links.pop(asyncio.get_running_loop(), None)
        self._last = (None, None)
        if link is not None:
            link.close("BatchingRedis closed")

    # --- per process, per loop ---------------------------------------------------------

    def _check_fork(self) -> None:
        if self._pid != os.getpid():
            self._forget()

    def _forget(self) -> None:
        """In a forked child: the parent's connections are dropped, never touched."""
        self._pid = os.getpid()
        self._links = {}
        self._last = (None, None)
        self._round_trips = 0
        self._commands = 0

    def _link(self, loop: asyncio.AbstractEventLoop) -> _Link:
        self._check_fork()
        link = self._links.get(loop)
        if link is None:
            for old in [lp for lp in self._links if lp.is_closed()]:
                del self._links[old]
            link = self._links[loop] = _Link(self, loop)
        self._last = (loop, link)
        return link

    async def _open(self, link: _Link) -> _Wire:
        """A connection made and set up by redis-py (AUTH, SELECT, TLS, Sentinel), its
        transport then taken over by a ``_Wire``."""
        client = self._settings.async_client(socket_timeout_s=self.socket_timeout_s)
        pool = client.connection_pool
        conn: Any = pool.make_connection()  # type: ignore[no-untyped-call]
        await conn.connect()
        try:
            if self.client_name is not None:
                await conn.send_command("CLIENT", "SETNAME", self.client_name)
                # an ACL user without +client|setname: unnamed, still usable
                with contextlib.suppress(rexc.ResponseError):
                    await conn.read_response()
            writer = conn._writer
            stream = conn._reader
            if writer is None or stream is None:
                raise rexc.ConnectionError("redis-py gave no stream to take over")
            left = bytes(getattr(stream, "_buffer", b""))
        except BaseException:
            await conn.disconnect()
            raise
        reader = hiredis.Reader(replyError=_reply_error,
                                protocolError=rexc.InvalidResponse,
                                **({"encoding": self.encoding} if self.encoding else {}))
        transport = writer.transport
        wire = _Wire(link, transport, reader, self.socket_timeout_s)
        transport.set_protocol(wire)
        wire.keep = (writer, stream)
        conn._reader = conn._writer = None  # the transport is the wire's now
        if left:
            wire.data_received(left)
        if transport.is_closing():
            wire.closed = True
            raise rexc.ConnectionError("the connection closed while it was set up")
        return wire


_INSTANCES: weakref.WeakSet[BatchingRedis] = weakref.WeakSet()


def _after_fork() -> None:
    for instance in list(_INSTANCES):
        instance._forget()


os.register_at_fork(after_in_child=_after_fork)
