"""A small asyncio TCP proxy for fault injection on loopback.

The proxy runs its own event loop in a daemon thread (the shared
:class:`tcpproxy.ThreadedProxy`); every control method is called from the test's thread
and is safe to call at any time.

* pass-through (the default): bytes flow both ways unchanged;
* :meth:`Proxy.pause`: stop forwarding and hold the bytes (TCP back-pressure); they are
  delivered when the pause ends, like a network that stalls and recovers;
* :meth:`Proxy.blackhole`: the server is unreachable. Connections are still accepted
  (as a SYN to a partitioned host would not be refused at once) but every byte, either
  way, is dropped. A connection that lost a byte can never be in sync again, so when
  the blackhole ends it is reset, as TCP would after its retransmissions gave up;
  connections that lost nothing carry on;
* :meth:`Proxy.reset_all`: reset every open connection (RST to the client, the
  upstream side closed), or only those whose last client bytes contain ``match``;
* :meth:`Proxy.reset_after_reply`: arm a one-shot trap: the next connection whose client
  bytes contain ``match`` (any, without one) is reset after ``nbytes`` more bytes of the
  server's reply have been passed on: a reply cut in the middle.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import socket
import struct
import threading
from dataclasses import dataclass, field

from tcpproxy import ThreadedProxy

_LINGER_RST = struct.pack("ii", 1, 0)


@dataclass
class Cut:
    """An armed :meth:`Proxy.reset_after_reply`; ``fired`` is set once it reset one."""

    nbytes: int
    match: bytes | None
    fired: threading.Event = field(default_factory=threading.Event)
    head: bytes = b""
    """The first bytes of the reply that was cut (what the client did receive)."""
    conn_id: int = -1


@dataclass(eq=False)
class _Conn:
    id: int
    client_w: asyncio.StreamWriter
    server_w: asyncio.StreamWriter
    last_sent: bytes = b""
    broken: bool = False
    """A byte was dropped by a blackhole: reset it when the blackhole ends."""
    cut_left: int | None = None
    cut: Cut | None = None
    tasks: list[asyncio.Task[None]] = field(default_factory=list)
    closed: bool = False


class Proxy(ThreadedProxy):
    """``Proxy(upstream_port)``, then ``start()``; ``url`` is the address to use."""

    thread_name = "fault-proxy"

    def __init__(self, upstream_port: int, upstream_host: str = "127.0.0.1",
                 host: str = "127.0.0.1", port: int = 0, db: int = 0) -> None:
        super().__init__(upstream_port, upstream_host, host=host, port=port)
        self.db = db
        self._conns: dict[int, _Conn] = {}
        self._ids = itertools.count(1)
        self._blackhole = False
        self._paused = False
        self._resume: asyncio.Event | None = None
        self._cuts: list[Cut] = []
        self.accepted = 0
        self.resets = 0
        self.dropped_bytes = 0

    # --- lifecycle ---------------------------------------------------------------------

    async def _setup(self) -> None:
        self._resume = asyncio.Event()
        self._resume.set()

    async def _close_connections(self) -> None:
        for c in list(self._conns.values()):
            self._reset(c)

    @property
    def url(self) -> str:
        return f"redis://{self.host}:{self.port}/{self.db}"

    @property
    def connections(self) -> int:
        return len(self._conns)

    # --- faults ------------------------------------------------------------------------

    def blackhole(self, on: bool = True) -> int:
        """Drop every byte (``on``) or end the blackhole; ending it resets the
        connections that lost bytes and returns how many."""

        async def switch() -> int:
            self._blackhole = on
            if on:
                return 0
            broken = [c for c in self._conns.values() if c.broken]
            for c in broken:
                self._reset(c)
            return len(broken)

        return int(self._call(switch()))

    def pause(self, on: bool = True) -> None:
        """Hold every byte (``on``) until the pause ends."""

        async def switch() -> None:
            assert self._resume is not None
            self._paused = on
            if on:
                self._resume.clear()
            else:
                self._resume.set()

        self._call(switch())

    def reset_all(self, match: bytes | None = None) -> int:
        """Reset every connection (or those whose last client bytes contain ``match``);
        returns how many."""

        async def reset() -> int:
            hit = [c for c in self._conns.values()
                   if match is None or match in c.last_sent]
            for c in hit:
                self._reset(c)
            return len(hit)

        return int(self._call(reset()))

    def reset_after_reply(self, nbytes: int, match: bytes | None = None) -> Cut:
        """Arm a one-shot cut; see the module docstring. Returns the :class:`Cut`."""
        cut = Cut(nbytes, match)

        async def arm() -> None:
            self._cuts.append(cut)

        self._call(arm())
        return cut

    # --- plumbing ----------------------------------------------------------------------

    async def _handle(self, client_r: asyncio.StreamReader,
                      client_w: asyncio.StreamWriter) -> None:
        try:
            server_r, server_w = await self._open_upstream()
        except OSError:
            _abort(client_w)
            return
        self.accepted += 1
        conn = _Conn(next(self._ids), client_w, server_w)
        self._conns[conn.id] = conn
        conn.tasks = [
            asyncio.create_task(self._pump(conn, client_r, server_w, upstream=True)),
            asyncio.create_task(self._pump(conn, server_r, client_w, upstream=False)),
        ]
        await asyncio.gather(*conn.tasks, return_exceptions=True)
        self._close(conn)

    async def _pump(self, conn: _Conn, reader: asyncio.StreamReader,
                    writer: asyncio.StreamWriter, *, upstream: bool) -> None:
        assert self._resume is not None
        try:
            while not conn.closed:
                data = await reader.read(65536)
                if not data:
                    break
                if self._paused:
                    await self._resume.wait()
                if conn.closed:
                    return
                if self._blackhole:
                    conn.broken = True
                    self.dropped_bytes += len(data)
                    continue
                if upstream:
                    conn.last_sent = data[-4096:]
                    for cut in self._cuts:
                        if cut.match is None or cut.match in data:
                            self._cuts.remove(cut)
                            conn.cut, conn.cut_left = cut, cut.nbytes
                            cut.conn_id = conn.id
                            break
                elif conn.cut_left is not None and conn.cut is not None:
                    if len(data) >= conn.cut_left:
                        head = data[: conn.cut_left]
                        conn.cut.head += head
                        writer.write(head)
                        with contextlib.suppress(ConnectionError):
                            await writer.drain()
                        cut = conn.cut
                        self._reset(conn)
                        cut.fired.set()
                        return
                    conn.cut_left -= len(data)
                    conn.cut.head += data
                writer.write(data)
                await writer.drain()
            if not conn.closed and writer.can_write_eof():
                writer.write_eof()
        except (ConnectionError, OSError):
            self._reset(conn)

    def _reset(self, conn: _Conn) -> None:
        """RST to the client (SO_LINGER 0 and abort), the upstream side dropped too."""
        if conn.closed:
            return
        conn.closed = True
        self.resets += 1
        _abort(conn.client_w)
        _abort(conn.server_w)
        self._conns.pop(conn.id, None)
        for t in conn.tasks:
            if t is not asyncio.current_task():
                t.cancel()

    def _close(self, conn: _Conn) -> None:
        if conn.closed:
            return
        conn.closed = True
        for w in (conn.client_w, conn.server_w):
            with contextlib.suppress(Exception):
                w.close()
        self._conns.pop(conn.id, None)


def _abort(writer: asyncio.StreamWriter) -> None:
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_RST)
    writer.transport.abort()
