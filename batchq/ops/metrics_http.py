"""The metrics HTTP server: /metrics, /healthz (the supervisor is alive) and /readyz
(Redis answers), for the supervisor's metrics process or a single worker's thread.

Under a flood of scrapes it stays answerable: one asyncio loop instead of a thread per
connection, a deep listen backlog, /healthz answered on the loop without waiting for
anything, and concurrent /metrics requests sharing one collection at a time
(``SharedScrape``) instead of each reading Redis. What is collected is ``metrics.py``'s.

Clients that connect and send nothing cannot use up the process's descriptors (the
supervisor's metrics process also serves the console): open connections are capped
(``connlimit``; ``$BATCHQ_METRICS_MAX_CONNECTIONS``), at the cap the oldest one still
waiting for its request is closed to admit a new one, and a request not received
within ``REQUEST_TIMEOUT_S`` is dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import socket
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import Executor, ThreadPoolExecutor
from typing import Any

from .connlimit import REFUSAL, ConnectionGate, accept_batch, deepen, max_connections_from
from .metrics import HasClients, build_registry

log = logging.getLogger("batchq.metrics")

MAX_CONNECTIONS_ENV = "BATCHQ_METRICS_MAX_CONNECTIONS"

REQUEST_TIMEOUT_S = 10.0
"""A client that has not sent its request after this long is dropped."""

MAX_REQUEST_BYTES = 16 * 1024
"""Request line plus headers; a longer request is dropped."""


class SharedScrape:
    """One collection at a time, shared by every request that waits for it.

    A request is answered with a collection that started after it arrived, so an answer
    is never older than its request; requests that arrive while a collection runs all
    take the next one. A flood of N scrapes therefore costs about two collections, not N.
    Runs on the server's event loop; ``produce`` runs in a thread."""

    def __init__(self, produce: Callable[[], bytes], executor: Executor | None = None) -> None:
        self._produce = produce
        self._executor = executor
        self._running: asyncio.Future[bytes] | None = None
        self._started = 0
        self._finished = 0
        self._result: bytes | BaseException = b""

    async def get(self) -> bytes:
        want = self._started + 1  # the first collection to start after now
        while self._finished < want:
            if self._running is None:
                self._started += 1
                fut = asyncio.get_running_loop().run_in_executor(self._executor,
                                                                 self._produce)
                fut.add_done_callback(functools.partial(self._done, self._started))
                self._running = fut
            # callbacks run in the order added: _done has run when this wait returns
            await asyncio.wait([self._running])
        if isinstance(self._result, BaseException):
            raise self._result
        return self._result

    def _done(self, n: int, fut: asyncio.Future[bytes]) -> None:
        self._finished = n
        self._running = None
        exc = fut.exception()
        self._result = exc if exc is not None else fut.result()


class MetricsServer:
    """/metrics, /healthz and /readyz over one asyncio loop (its own thread).

    No thread per connection: accepting is cheap, /healthz is answered on the loop
    itself and never waits for a collection, and /metrics requests wait on a shared
    collection (``SharedScrape``) that runs in a small thread pool. The socket is bound
    on construction, so a busy port fails at once. ``serve_forever`` / ``shutdown`` /
    ``server_close`` / ``server_address`` as on a ``socketserver`` server."""

    def __init__(self, app: HasClients, addr: str, port: int, *,
                 multiproc_dir: str | None, parent_pid: int | None,
                 max_connections: int | None = None, collectors: Iterable[Any] = ()) -> None:
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        self._app = app
        self._parent_pid = parent_pid
        self._ctype = CONTENT_TYPE_LATEST
        self._gate = ConnectionGate("metrics server", max_connections_from(
            max_connections, MAX_CONNECTIONS_ENV, log), log)
        # asyncio accepts up to the backlog at once: bounded so a burst cannot overshoot
        # the cap (the kernel's queue is deepened once serving)
        self._backlog = accept_batch(self._gate.max_connections)
        family = socket.AF_INET6 if ":" in addr else socket.AF_INET
        self._sock = socket.create_server((addr, port), family=family,
                                          backlog=self._backlog)
        self.server_address: tuple[str, int] = self._sock.getsockname()[:2]
        self._pool = ThreadPoolExecutor(4, thread_name_prefix="batchq-metrics-io")
        extra = list(collectors)
        single = None if multiproc_dir else build_registry(app, None, extra)
        self._scrape = SharedScrape(lambda: generate_latest(
            single or build_registry(app, multiproc_dir, extra)), self._pool)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._stopped = threading.Event()

    def serve_forever(self) -> None:
        loop = asyncio.new_event_loop()
        try:
            loop.run_until_complete(self._serve(loop))
        finally:
            loop.close()
            self._stopped.set()

    async def _serve(self, loop: asyncio.AbstractEventLoop) -> None:
        self._stop = asyncio.Event()
        self._loop = loop
        loop.set_exception_handler(self._gate.exception_handler)
        server = await asyncio.start_server(self._handle, sock=self._sock,
                                            limit=MAX_REQUEST_BYTES, backlog=self._backlog)
        deepen(self._sock)
        async with server:
            await self._stop.wait()

    def shutdown(self) -> None:
        """Stop ``serve_forever`` (from another thread) and wait until it returned."""
        loop, stop = self._loop, self._stop
        if loop is not None and stop is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                loop.call_soon_threadsafe(stop.set)
                self._stopped.wait(10)
        self._pool.shutdown(wait=False)

    def server_close(self) -> None:
        self._sock.close()

    async def _handle(self, reader: asyncio.StreamReader,
                      writer: asyncio.StreamWriter) -> None:
        if not self._gate.opened(writer, writer.transport.abort):
            writer.write(REFUSAL)
            writer.close()
            return
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), REQUEST_TIMEOUT_S)
            self._gate.busy(writer)
            method, _, rest = head.partition(b" ")
            path = rest.partition(b" ")[0].partition(b"?")[0].decode("latin-1")
            if method != b"GET":
                code, body, ctype = 405, b"only GET\n", "text/plain; charset=utf-8"
            else:
                code, body, ctype = await self._route(path)
            writer.write(b"HTTP/1.0 %d %s\r\nContent-Type: %s\r\nContent-Length: %d\r\n"
                         b"Connection: close\r\n\r\n%s" % (
                             code, _REASONS.get(code, "Error").encode(), ctype.encode(),
                             len(body), body))
            await writer.drain()
        except (TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError,
                ConnectionError, OSError):
            pass  # a client that went away or never finished its request
        finally:
            self._gate.closed(writer)
            writer.close()

    async def _route(self, path: str) -> tuple[int, bytes, str]:
        text = "text/plain; charset=utf-8"
        if path == "/metrics":
            try:
                return 200, await self._scrape.get(), self._ctype
            except Exception as exc:
                log.warning("metrics collection failed: %s", exc)
                return 500, f"collection failed: {type(exc).__name__}\n".encode(), text
        if path == "/healthz":
            # on the loop, no Redis, no collection: a liveness probe never waits
            alive = self._parent_pid is None or os.getppid() == self._parent_pid
            return (200, b"ok\n", text) if alive else (503, b"supervisor gone\n", text)
        if path == "/readyz":
            try:
                await asyncio.get_running_loop().run_in_executor(
                    self._pool, self._app.clients.redis.ping)
                return 200, b"ok\n", text
            except Exception as exc:
                return 503, f"redis unreachable: {type(exc).__name__}\n".encode(), text
        return 404, b"not found\n", text


_REASONS = {200: "OK", 404: "Not Found", 405: "Method Not Allowed",
            500: "Internal Server Error", 503: "Service Unavailable"}


def make_server(app: HasClients, addr: str, port: int, *, multiproc_dir: str | None,
                parent_pid: int | None, max_connections: int | None = None,
                collectors: Iterable[Any] = ()) -> MetricsServer:
    """An HTTP server for /metrics, /healthz (the supervisor is alive) and /readyz
    (Redis answers). ``max_connections``: open connections at most (default
    ``$BATCHQ_METRICS_MAX_CONNECTIONS``, else derived from the file limit); ``collectors``:
    read at every scrape besides the queues' (``supervisor_metrics.app_collectors``)."""
    return MetricsServer(app, addr, port, multiproc_dir=multiproc_dir, parent_pid=parent_pid,
                         max_connections=max_connections, collectors=collectors)


def serve_in_thread(app: HasClients, addr: str, port: int,
                    collectors: Iterable[Any] = ()) -> MetricsServer | None:
    """Single-process mode: serve from a daemon thread of the worker itself."""
    try:
        server = make_server(app, addr, port, multiproc_dir=None, parent_pid=None,
                             collectors=collectors)
    except OSError as exc:
        log.warning("metrics server not started on %s:%d: %s", addr, port, exc)
        return None
    threading.Thread(target=server.serve_forever, name="batchq-metrics", daemon=True).start()
    log.info("metrics on http://%s:%d/metrics", addr, server.server_address[1])
    return server
