"""The supervisor's metrics side: the process that serves ``/metrics`` for every worker
of one ``batchq worker -p N`` (and the web console, with ``--web``), and the file of the
supervisor's own counts it reads.

The supervisor (``supervisor.py``) forks the server as a child of its own once the
workers run, restarts it with a backoff (2, 4, ... 60 s) when it exits, and stops it
last (SIGTERM: the process stops both servers and exits). The server reads the workers'
metrics from prometheus_client's multiprocess directory and the supervisor's counts
(processes, restarts) from ``SUPERVISOR_FILE`` there, rewritten atomically whenever they
change. The console is started after the fork, in a thread of this process, so nothing
of it crosses a fork; one that cannot listen is retried with the same backoff while
``/metrics`` goes on.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import time
from types import FrameType
from typing import TYPE_CHECKING, Any

from .exitcodes import EXIT_ERROR, EXIT_OK

if TYPE_CHECKING:
    from ..tasks.app import App
    from ..web import WebServer
    from ..web.settings import WebSettings

log = logging.getLogger("batchq.supervisor")
metrics_log = logging.getLogger("batchq.metrics")
web_log = logging.getLogger("batchq.web")



def app_collectors(app: App) -> list[Any]:
    """What ``/metrics`` reads through the app's registry at every scrape, besides the
    queues (``metrics`` itself only takes clients): campaigns, the periodic tasks' runs,
    circuit breakers."""
    from ..flow.breaker import BreakerCollector
    from ..produce.campaign import CampaignCollector
    from ..produce.periodic import PeriodicCollector

    return [CampaignCollector(app), PeriodicCollector(app), BreakerCollector(app)]


class MetricsChild:
    """The metrics server process of one supervisor, and the supervisor's counts file.
    It runs when it serves something: ``/metrics`` (a directory and a port other than
    0) or the web console (``web``)."""

    def __init__(self, app: App, *, directory: str | None, addr: str, port: int,
                 log_level: str, log_format: str, signals: tuple[str, ...],
                 web: WebSettings | None = None) -> None:
        self.app = app
        self.directory = directory
        self.addr = addr
        self.port = port
        self.web = web
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
            from ..ops.metrics import write_supervisor_state

            with contextlib.suppress(OSError):
                write_supervisor_state(d, processes, dict(restarts))
                self._published = state

    def manage(self) -> None:
        """Fork the server if it should run and does not (after its backoff)."""
        serves_metrics = bool(self.directory and self.port)
        if self.pid is not None or not (serves_metrics or self.web):
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
            from ..ops.logs import setup_logging

            setup_logging(self.log_level, self.log_format, "metrics")
            code = serve_child(self.app, self.addr, self.port,
                               self.directory if serves_metrics else None, parent,
                               web=self.web)
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


def serve_child(app: App, addr: str, port: int, directory: str | None, parent_pid: int, *,
                web: WebSettings | None = None) -> int:
    """Body of the metrics process: ``/metrics`` on ``addr:port`` from the multiprocess
    ``directory`` (None: no metrics server) and the console ``web``, until SIGTERM or
    until the supervisor is gone. A metrics server that cannot listen ends the process
    (the supervisor starts it again later); a console that cannot listen is tried again
    with a backoff here."""
    stop = threading.Event()

    def on_term(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_term)
    server = None
    if directory is not None:
        from ..ops.metrics_http import make_server

        try:
            server = make_server(app, addr, port, multiproc_dir=directory,
                                 parent_pid=parent_pid, collectors=app_collectors(app))
        except OSError as exc:
            metrics_log.error("metrics server cannot listen on %s:%d: %s", addr, port, exc)
            return EXIT_ERROR
        metrics_log.info("metrics on http://%s:%d/metrics", addr, server.server_address[1])
        threading.Thread(target=server.serve_forever, name="batchq-metrics",
                         daemon=True).start()
    console: WebServer | None = None
    failures, retry_at = 0, 0.0
    try:
        while os.getppid() == parent_pid and not stop.is_set():
            if web is not None and console is None and time.monotonic() >= retry_at:
                from ..web import start_in_thread

                try:
                    console = start_in_thread(app, web.host, web.port, web.token,
                                              web.read_only, refresh_s=web.refresh_s)
                except OSError as exc:
                    failures += 1
                    delay = min(60.0, 2.0 ** failures)
                    retry_at = time.monotonic() + delay
                    web_log.error("web console cannot listen on %s:%d: %s; trying again "
                                  "in %.0fs", web.host, web.port, exc, delay)
            stop.wait(1.0)
    finally:
        if console is not None:
            console.stop()
        if server is not None:
            server.shutdown()
    return EXIT_OK
