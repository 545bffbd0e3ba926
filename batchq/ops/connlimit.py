"""A cap on the open connections of an HTTP server (the web console, the metrics
server), so that clients which connect and send nothing cannot use up the process's
file descriptors.

Each open connection holds a descriptor, and so does everything else the process does
(Redis connections, under ``worker --web`` the worker itself). A server that accepts
until the file limit stops accepting anything, the loop's accept reports every refusal
with a traceback, and the process's own Redis connections start failing. So a server
keeps at most ``max_connections`` open; past it, the oldest connection that is idle
(no request yet, or between keep-alive requests) is closed to admit the new one, and
only when every open connection is in the middle of a request is the new one refused
(a short 503, closed at once). A real client's request arrives milliseconds after its
connection, so idle connections can delay it only by that long.

The default cap comes from the file limit: a quarter of the descriptors still free when
the server starts, since two servers may share a process and the rest of the process
needs the other half. What is dropped or refused is logged once per burst.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from collections.abc import Callable, Hashable
from typing import Any

DEFAULT_MAX_CONNECTIONS = 1024
"""The cap when the file limit allows more (or is unknown)."""

MIN_MAX_CONNECTIONS = 8
"""The smallest derived cap: a server below it is not worth running."""

LIMIT_MAX_CONNECTIONS = 1_000_000
"""The largest cap a setting may ask for."""

HEADER_TIMEOUT_S = 10.0
"""A connection must complete its request line and headers within this long after it
opened (or after its previous response): it is closed otherwise."""

KEEP_ALIVE_TIMEOUT_S = 5.0
"""An idle keep-alive connection is closed after this long."""

LOG_INTERVAL_S = 10.0
"""At most one log line per this long about dropped and refused connections."""

REFUSAL = (b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain; charset=utf-8\r\n"
           b"Content-Length: 36\r\nRetry-After: 1\r\nConnection: close\r\n\r\n"
           b"too many open connections, try again")


def open_files() -> int | None:
    """Descriptors this process has open now (None where /proc is not available)."""
    try:
        return len(os.listdir("/proc/self/fd"))
    except OSError:
        return None


def file_limit() -> int | None:
    """The soft RLIMIT_NOFILE (None when unlimited or unknown)."""
    try:
        import resource

        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    except (ImportError, OSError, ValueError):
        return None
    return None if soft == resource.RLIM_INFINITY else int(soft)


def default_max_connections() -> int:
    """A quarter of the descriptors free now, at least ``MIN_MAX_CONNECTIONS`` and at
    most ``DEFAULT_MAX_CONNECTIONS``."""
    limit = file_limit()
    if limit is None:
        return DEFAULT_MAX_CONNECTIONS
    free = limit - (open_files() or 0)
    return max(MIN_MAX_CONNECTIONS, min(DEFAULT_MAX_CONNECTIONS, free // 4))


def max_connections_from(value: int | None, env: str, logger: logging.Logger) -> int:
    """The cap to use: ``value`` if given, else ``$env`` if set, else the default
    derived from the file limit. Raises ``ValueError`` naming ``value`` when it is not a
    whole number from 1 to ``LIMIT_MAX_CONNECTIONS``; a bad ``$env`` is logged and the
    default used (it is read in processes that cannot exit 2 any more, such as the
    supervisor's metrics process, and must not stop them)."""
    if value is None:
        text = os.environ.get(env, "").strip()
        if not text:
            return default_max_connections()
        try:
            value = _checked(int(text), env)
        except ValueError:
            fallback = default_max_connections()
            logger.warning("ignoring $%s=%r: not a whole number from 1 to %s; using %d",
                           env, text, f"{LIMIT_MAX_CONNECTIONS:,}", fallback)
            return fallback
        return value
    return _checked(value, "max_connections")


def _checked(value: object, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) \
            or not 1 <= value <= LIMIT_MAX_CONNECTIONS:
        raise ValueError(f"{name} must be a whole number from 1 to {LIMIT_MAX_CONNECTIONS:,}"
                         f", not {value!r}")
    return value


LISTEN_BACKLOG = 1024
"""Connections the kernel queues for a server while it is busy (a short queue makes
clients retry their SYN after a second and more)."""


def accept_batch(max_connections: int) -> int:
    """The backlog to give asyncio with a cap: it accepts up to that many connections in
    one go before any of them can be closed, so a deep one would overshoot the cap (and
    the file limit) in a burst. The kernel's queue is deepened afterwards
    (``deepen``): asyncio gives both the same number."""
    return max(8, min(128, max_connections // 4))


def deepen(sock: socket.socket) -> None:
    """Give the listening ``sock`` the kernel queue ``LISTEN_BACKLOG`` again, after
    asyncio set it to its (small) accept batch."""
    sock.listen(LISTEN_BACKLOG)


class ConnectionGate:
    """The open connections of one server, oldest first, and whether each is idle.

    ``opened(key, close)`` admits a new connection (closing the oldest idle one when at
    the cap) or returns False (the caller refuses it); ``busy`` / ``idle`` mark a
    request started / answered; ``closed`` forgets it. All on the server's loop."""

    def __init__(self, name: str, max_connections: int, logger: logging.Logger) -> None:
        self.name = name
        self.max_connections = max_connections
        self._log = logger
        self._open: dict[Hashable, Callable[[], None]] = {}
        self._idle: dict[Hashable, None] = {}  # insertion order: oldest idle first
        self._dropped = 0
        self._refused = 0
        self._accept_errors = 0
        self._next_log_at = 0.0

    def __len__(self) -> int:
        return len(self._open)

    def opened(self, key: Hashable, close: Callable[[], None]) -> bool:
        if len(self._open) >= self.max_connections:
            if not self._idle:
                self._refused += 1
                self._report()
                return False
            oldest = next(iter(self._idle))
            self._dropped += 1
            self._open.pop(oldest)()
            del self._idle[oldest]
            self._report()
        self._open[key] = close
        self._idle[key] = None
        return True

    def busy(self, key: Hashable) -> None:
        self._idle.pop(key, None)

    def idle(self, key: Hashable) -> None:
        if key in self._open:
            self._idle.pop(key, None)
            self._idle[key] = None  # now the newest idle one

    def closed(self, key: Hashable) -> None:
        self._open.pop(key, None)
        self._idle.pop(key, None)

    def accept_failed(self, exc: BaseException | None) -> None:
        """The loop could not accept (out of descriptors): counted and reported with
        the rest, without a traceback; the loop retries by itself."""
        self._accept_errors += 1
        self._report(exc)

    def _report(self, exc: BaseException | None = None) -> None:
        now = time.monotonic()
        if now < self._next_log_at:
            return
        self._next_log_at = now + LOG_INTERVAL_S
        limit = file_limit()
        self._log.warning(
            "%s: %d connections open (cap %d, file limit %s): %d idle ones closed, %d "
            "refused, %d accepts failed%s; next report in %gs at the earliest",
            self.name, len(self._open), self.max_connections,
            limit if limit is not None else "unlimited", self._dropped, self._refused,
            self._accept_errors, f" ({exc})" if exc is not None else "", LOG_INTERVAL_S)
        self._dropped = self._refused = self._accept_errors = 0

    def exception_handler(self, loop: asyncio.AbstractEventLoop,
                          context: dict[str, Any]) -> None:
        """For ``loop.set_exception_handler``: an accept that ran out of descriptors is
        reported by the gate (once per burst); anything else as the loop would."""
        exc = context.get("exception")
        if isinstance(exc, OSError) and "accept" in str(context.get("message", "")):
            self.accept_failed(exc)
            return
        loop.default_exception_handler(context)
