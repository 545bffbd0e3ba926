"""The supervisor's metrics side: the process that serves ``/metrics`` for every worker
of one ``batchq worker -p N``, and the file of the supervisor's own counts it reads.

The supervisor (``supervisor.py``) forks the server as a child of its own once the
workers run, restarts it with a backoff (2, 4, ... 60 s) when it exits, and stops it
last. The server reads the workers' metrics from prometheus_client's multiprocess
directory and the supervisor's counts (processes, restarts) from ``SUPERVISOR_FILE``
there, rewritten atomically whenever they change.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import time
from typing import TYPE_CHECKING

from .exitcodes import EXIT_ERROR

if TYPE_CHECKING:
    from .app import App

log = logging.getLogger("batchq.supervisor")


class MetricsChild:
    """The metrics server process of one supervisor (none without a directory or with
    port 0), and the supervisor's counts file."""

    def __init__(self, app: App, *, directory: str | None, addr: str, port: int,
                 log_level: str, log_format: str, signals: tuple[str, ...]) -> None:
        self.app = app
        self.directory = directory
        self.addr = addr
        self.port = port
        self.log_level = log_level
        self.log_format = log_format
        self.signals = signals
        """The supervisor's signals: reset to their defaults in the forked server."""
        self.pid: int | None = None
        self._next_at = 0.0
        self._failures = 0
        self._published: tuple[int, tuple[int, ...]] | None = None

    def publish_state(self, processes: int, restarts: dict[str, int]) -> None:
        """Rewrite the counts file when the counts changed."""
        d = self.directory
        state = (processes, tuple(restarts.values()))
        if d and state != self._published:
            from .metrics import write_supervisor_state

            with contextlib.suppress(OSError):
                write_supervisor_state(d, processes, dict(restarts))
                self._published = state

    def manage(self) -> None:
        """Fork the server if it should run and does not (after its backoff)."""
        if not self.directory or not self.port or self.pid is not None:
            return
        if time.monotonic() < self._next_at:
            return
        parent = os.getpid()
        pid = os.fork()
        if pid:
            self.pid = pid
            return
        code = EXIT_ERROR
        try:
            for name in self.signals:
                signal.signal(getattr(signal, f"SIG{name}"), signal.SIG_DFL)
            signal.signal(signal.SIGINT, signal.SIG_IGN)  # the supervisor ends it
            from .logs import setup_logging
            from .metrics_http import serve_forever_child

            setup_logging(self.log_level, self.log_format, "metrics")
            code = serve_forever_child(self.app, self.addr, self.port, self.directory,
                                       parent)
        except BaseException:
            log.exception("metrics server crashed")
        finally:
            os._exit(code)

    def on_exit(self, status: int, stopping: bool) -> None:
        """The server exited (reaped by the supervisor): restart it later, unless the
        supervisor is stopping."""
        self.pid = None
        if stopping:
            return
        self._failures += 1
        delay = min(60.0, 2.0 ** self._failures)
        self._next_at = time.monotonic() + delay
        log.warning("metrics server exited (%d); restarting it in %.0fs",
                    os.waitstatus_to_exitcode(status), delay)

    def stop(self) -> None:
        """SIGTERM the server and wait for it."""
        pid = self.pid
        if pid is None:
            return
        self.pid = None
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGTERM)
            os.waitpid(pid, 0)
