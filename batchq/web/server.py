"""Serving the console: uvicorn in a thread of its own, on a socket bound up front.

:func:`start_in_thread` is what a process that does something else (the supervisor's
metrics process, for ``batchq worker --web``) calls; :func:`serve` blocks until SIGINT or
SIGTERM (``batchq web``). Both refuse a non-loopback address without a token before
anything listens, and bind the socket themselves so a busy port fails at once with a
clear error and port 0 picks a free port.
"""

from __future__ import annotations

import logging
import signal
import socket
import threading
import time
from types import FrameType
from typing import TYPE_CHECKING

import uvicorn

from ..web_settings import HOST, PORT, REFRESH_S
from .routes import create_app
from .security import check_bind

if TYPE_CHECKING:
    from ..app import App

log = logging.getLogger("batchq.web")

DEFAULT_HOST, DEFAULT_PORT = HOST, PORT
START_TIMEOUT_S = 10.0


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
                    refresh_s: float = REFRESH_S) -> WebServer:
    """Serve the console from a daemon thread and return once it accepts connections.

    Raises :class:`~batchq.web.security.InsecureBindError` (a ``ValueError``) for a
    non-loopback ``host`` without ``token``, and ``OSError`` when the address is taken."""
    check_bind(host, token)
    asgi = create_app(app, token=token, read_only=read_only, app_queues=app_queues,
                      refresh_s=refresh_s)
    sock = _bind(host, port)
    config = uvicorn.Config(asgi, log_level="warning", access_log=False, lifespan="off",
                            server_header=False, loop="asyncio", http="h11")
    server = uvicorn.Server(config)
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
          app_queues: list[str] | None = None, refresh_s: float = REFRESH_S) -> None:
    """Serve the console until SIGINT or SIGTERM (call from the main thread)."""
    web = start_in_thread(app, host, port, token, read_only, app_queues=app_queues,
                          refresh_s=refresh_s)
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
