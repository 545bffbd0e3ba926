"""Serving the console: uvicorn in a thread of its own, on a socket bound up front.

:func:`start_in_thread` is what a process that does something else (the supervisor's
metrics process, for ``batchq worker --web``) calls; :func:`serve` blocks until SIGINT or
SIGTERM (``batchq web``). Both refuse a non-loopback address without a token before
anything listens, and bind the socket themselves so a busy port fails at once with a
clear error and port 0 picks a free port.

Connections are capped (``connlimit``): at most ``max_connections`` open (by default
derived from the file limit; ``$BATCHQ_WEB_MAX_CONNECTIONS``), a connection that has not
sent its request headers within ``HEADER_TIMEOUT_S`` is closed, and at the cap the oldest
idle connection makes room for a new one, so clients that connect and send nothing can
neither exhaust the process's descriptors nor keep a real request out.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import socket
import threading
import time
from types import FrameType
from typing import TYPE_CHECKING, Any, ClassVar

import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from ..ops.connlimit import (
    HEADER_TIMEOUT_S,
    KEEP_ALIVE_TIMEOUT_S,
    REFUSAL,
    ConnectionGate,
    accept_batch,
    deepen,
    max_connections_from,
)
from .routes import create_app
from .security import check_bind
from .settings import HOST, PORT, REFRESH_S

if TYPE_CHECKING:
    from ..tasks.app import App

log = logging.getLogger("batchq.web")

DEFAULT_HOST, DEFAULT_PORT = HOST, PORT
START_TIMEOUT_S = 10.0
MAX_CONNECTIONS_ENV = "BATCHQ_WEB_MAX_CONNECTIONS"


class _GatedH11(H11Protocol):
    """uvicorn's h11 protocol under a :class:`ConnectionGate`, with a deadline for each
    request's headers (uvicorn has none before the first request)."""

    gate: ClassVar[ConnectionGate]
    _refused = False
    _header_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        if not self.gate.opened(self, transport.abort):
            self._refused = True
            transport.write(REFUSAL)
            transport.close()
            return
        super().connection_made(transport)
        self._arm_header_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._refused:
            return
        self.gate.closed(self)
        self._cancel_header_timer()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if not self._refused:
            super().data_received(data)

    def handle_events(self) -> None:
        cycle = self.cycle
        super().handle_events()
        if self.cycle is not cycle:  # a request's headers are complete
            self.gate.busy(self)
            self._cancel_header_timer()

    def on_response_complete(self) -> None:
        # idle first: answering may start a pipelined request (handle_events: busy)
        if not self.transport.is_closing():
            self.gate.idle(self)
            self._arm_header_timer()
        super().on_response_complete()

    def _arm_header_timer(self) -> None:
        self._cancel_header_timer()
        self._header_timer = self.loop.call_later(HEADER_TIMEOUT_S, self._headers_late,
                                                  self.cycle)

    def _cancel_header_timer(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _headers_late(self, cycle: object) -> None:
        self._header_timer = None
        if self.cycle is cycle and not self.transport.is_closing():
            self.transport.close()


class _GatedServer(uvicorn.Server):
    """A uvicorn server whose loop reports failed accepts through the gate (one line per
    burst) instead of one traceback each."""

    def __init__(self, config: uvicorn.Config, gate: ConnectionGate) -> None:
        super().__init__(config)
        self.gate = gate

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        asyncio.get_running_loop().set_exception_handler(self.gate.exception_handler)
        await super().startup(sockets)
        for sock in sockets or ():
            deepen(sock)


def _gated_config(asgi: Any, gate: ConnectionGate) -> uvicorn.Config:
    class Protocol(_GatedH11):
        pass

    Protocol.gate = gate
    return uvicorn.Config(asgi, log_level="warning", access_log=False, lifespan="off",
                          server_header=False, loop="asyncio", http=Protocol,
                          timeout_keep_alive=int(KEEP_ALIVE_TIMEOUT_S),
                          backlog=accept_batch(gate.max_connections))


class WebServer:
    """A console served from a daemon thread; :meth:`stop` ends it."""

    def __init__(self, server: uvicorn.Server, thread: threading.Thread, host: str,
                 port: int) -> None:
        self.server = server
        self.thread = thread
        self.host = host
        self.port = port

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/"

    def stop(self, timeout_s: float = 5.0) -> None:
        self.server.should_exit = True
        self.thread.join(timeout_s)
        close = getattr(self.server.config.app, "close", None)
        if callable(close):  # the console's background rate sampler
            close()

    def __repr__(self) -> str:
        return f"WebServer({self.url!r})"


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host.strip("[]"), port))
        sock.listen(128)
    except OSError:
        sock.close()
        raise
    sock.set_inheritable(True)
    return sock


def start_in_thread(app: App, host: str = DEFAULT_HOST, port: int = DEFAULT_PORT,
                    token: str | None = None, read_only: bool = False, *,
                    app_queues: list[str] | None = None,
                    refresh_s: float = REFRESH_S,
                    max_connections: int | None = None) -> WebServer:
    """Serve the console from a daemon thread and return once it accepts connections.

    ``max_connections``: open connections at most (default ``$BATCHQ_WEB_MAX_CONNECTIONS``,
    else a quarter of the descriptors free under the file limit, at most 1,024).

    Raises :class:`~batchq.web.security.InsecureBindError` (a ``ValueError``) for a
    non-loopback ``host`` without ``token``, ``ValueError`` for a bad
    ``max_connections``, and ``OSError`` when the address is taken."""
    check_bind(host, token)
    gate = ConnectionGate("web console", max_connections_from(max_connections,
                                                              MAX_CONNECTIONS_ENV, log), log)
    asgi = create_app(app, token=token, read_only=read_only, app_queues=app_queues,
                      refresh_s=refresh_s)
    sock = _bind(host, port)
    server = _GatedServer(_gated_config(asgi, gate), gate)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]},
                              name="batchq-web", daemon=True)
    thread.start()
    deadline = time.monotonic() + START_TIMEOUT_S
    while not server.started and thread.is_alive() and time.monotonic() < deadline:
        time.sleep(0.01)
    if not server.started:
        server.should_exit = True
        sock.close()
        raise OSError(f"the web console did not start on {host}:{port}")
    web = WebServer(server, thread, host, int(sock.getsockname()[1]))
    log.info("web console on %s (%s, %s)", web.url,
             "token required" if token else "no token: loopback only",
             "read-only" if read_only else "actions enabled")
    return web


def serve(app: App, host: str = DEFAULT_HOST, port: int = DEFAULT_PORT,
          token: str | None = None, read_only: bool = False, *,
          app_queues: list[str] | None = None, refresh_s: float = REFRESH_S,
          max_connections: int | None = None) -> None:
    """Serve the console until SIGINT or SIGTERM (call from the main thread)."""
    web = start_in_thread(app, host, port, token, read_only, app_queues=app_queues,
                          refresh_s=refresh_s, max_connections=max_connections)
    stop = threading.Event()

    def handle_stop(signum: int, frame: FrameType | None) -> None:
        stop.set()

    old = {s: signal.signal(s, handle_stop) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        while not stop.is_set() and web.thread.is_alive():
            stop.wait(0.5)
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        web.stop()
