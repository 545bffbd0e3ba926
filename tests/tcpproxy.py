"""The base of the tests' thread-hosted TCP proxies (tests/fixtures/proxy.py: fault
injection; tests/fixtures/tlsproxy.py: TLS termination).

A :class:`ThreadedProxy` listens on loopback (optionally with TLS) and runs its own
asyncio event loop in a daemon thread, so a synchronous test can put it between a
client and the server under test. Subclasses implement :meth:`ThreadedProxy._handle`
(one accepted client connection) and :meth:`ThreadedProxy._close_connections` (drop
every open one at stop); control methods run coroutines on the proxy's loop through
:meth:`ThreadedProxy._call`, safe to call from the test's thread at any time.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import threading
from collections.abc import Coroutine
from types import TracebackType
from typing import Any, Self


class ThreadedProxy:
    """``Proxy(upstream_port)``, then :meth:`start` (or ``with``); :attr:`port` is where
    clients connect, every connection is piped to ``upstream_host:upstream_port``."""

    thread_name = "proxy"

    def __init__(self, upstream_port: int, upstream_host: str = "127.0.0.1", *,
                 host: str = "127.0.0.1", port: int = 0,
                 ssl_context: ssl.SSLContext | None = None) -> None:
        self.upstream = (upstream_host, upstream_port)
        self.host = host
        self._want_port = port
        self.port = 0
        """The listening port (known once started)."""
        self._ssl = ssl_context
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._server: asyncio.Server | None = None

    # --- lifecycle ---------------------------------------------------------------------

    def start(self) -> Self:
        """Listen and serve in the proxy's thread; returns once it listens (or raises
        what stopped it from listening)."""
        ready = threading.Event()
        errors: list[BaseException] = []

        def main() -> None:
            loop = asyncio.new_event_loop()
            asyncio.set_event_loop(loop)
            self._loop = loop
            loop.set_exception_handler(self._on_loop_error)
            try:
                loop.run_until_complete(self._listen())
            except BaseException as exc:  # reported to start()
                errors.append(exc)
                ready.set()
                loop.close()
                return
            ready.set()
            try:
                loop.run_forever()
            finally:
                loop.run_until_complete(loop.shutdown_asyncgens())
                loop.close()

        self._thread = threading.Thread(target=main, name=self.thread_name, daemon=True)
        self._thread.start()
        if not ready.wait(10):
            raise RuntimeError(f"{type(self).__name__} did not start listening within 10s")
        if errors:
            self._loop = None
            raise errors[0]
        return self

    async def _listen(self) -> None:
        await self._setup()
        self._server = await asyncio.start_server(
            self._handle, self.host, self._want_port, ssl=self._ssl,
            ssl_handshake_timeout=5 if self._ssl is not None else None)
        self.port = self._server.sockets[0].getsockname()[1]

    def stop(self) -> None:
        """Stop listening, drop every open connection, stop the thread. Safe to call
        more than once."""
        loop = self._loop
        if loop is None or loop.is_closed():
            return

        async def close() -> None:
            if self._server is not None:
                self._server.close()
            await self._close_connections()

        with contextlib.suppress(Exception):
            self._call(close())
        loop.call_soon_threadsafe(loop.stop)
        if self._thread is not None:
            self._thread.join(10)
            self._thread = None
        self._loop = None

    def __enter__(self) -> Self:
        return self.start() if self._loop is None else self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    def _call(self, coro: Coroutine[Any, Any, Any], timeout_s: float = 10.0) -> Any:
        """Run ``coro`` on the proxy's loop and return its result (from any thread)."""
        if self._loop is None:
            coro.close()
            raise RuntimeError(f"{type(self).__name__} is not started")
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout_s)

    async def _open_upstream(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        return await asyncio.open_connection(*self.upstream)

    # --- for subclasses ------------------------------------------------------------------

    async def _setup(self) -> None:
        """Runs on the proxy's loop before it listens (create loop-bound objects here)."""

    async def _handle(self, reader: asyncio.StreamReader,
                      writer: asyncio.StreamWriter) -> None:
        """Serve one accepted client connection."""
        raise NotImplementedError

    async def _close_connections(self) -> None:
        """Drop every open connection (the proxy is stopping)."""

    def _on_loop_error(self, loop: asyncio.AbstractEventLoop,
                       context: dict[str, Any]) -> None:
        loop.default_exception_handler(context)
