"""The pre-fork supervisor: ``batchq worker APP -p N``.

Modelled on gunicorn's arbiter. The supervisor imports the app once (failing fast on an
import error), checks that Redis answers, then forks N worker processes. It owns no event
loop, no Redis connection and no thread across a fork: a child builds all of those itself.

Signal handlers only queue the signal and poke a self-pipe; the main loop dispatches
``handle_<signame>``, reaps children with ``waitpid(-1, WNOHANG)`` (also orphans when it
runs as PID 1; unknown pids are ignored), kills children whose heartbeat file went stale
(a blocked event loop), and tops the pool back up, with a backoff when children keep
dying (none for a child that drained on purpose: recycled after ``--max-jobs-per-child``
or past ``--max-memory-per-child``; each reason is counted for the metrics). A child
that cannot boot (import error, Redis unreachable, or any exit before its first
heartbeat) during the first start stops the supervisor with the child's exit
code instead of a crash loop.

Signals: TERM graceful (children drain), INT / QUIT / a second TERM fast, HUP rolling
restart with a fresh import of the app's modules, TTIN / TTOU one worker more / less,
TSTP pause fetching / CONT resume. The metrics server process (which also serves the
web console with ``--web``) and the counts it serves are in ``supervisor_metrics.py``.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import select
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from types import FrameType

from ..tasks.app import App
from ..web.settings import WebSettings
from . import WorkerSettings
from .exitcodes import (
    EXIT_ERROR,
    EXIT_IMPORT,
    EXIT_MEMORY,
    EXIT_OK,
    EXIT_RECYCLED,
    EXIT_REDIS,
    EXIT_STALLED,
)
from .supervisor_metrics import MetricsChild

log = logging.getLogger("batchq.supervisor")


@dataclass(frozen=True)
class SupervisorSettings:
    processes: int = 1
    heartbeat_timeout_s: float = 30.0
    """A child whose loop has not turned for this long is killed."""
    kill_grace_s: float = 5.0
    """After SIGTERM to an unresponsive child, SIGKILL follows this much later."""
    max_restart_backoff_s: float = 10.0
    log_level: str = "INFO"
    log_format: str = "plain"
    metrics_dir: str | None = None
    """prometheus_client's multiprocess directory (set up by the CLI); None: no metrics."""
    metrics_addr: str = "127.0.0.1"
    metrics_port: int = 9808
    """0: no metrics server."""
    web: WebSettings | None = None
    """The web console, served from the metrics process (``--web``); None: none."""


@dataclass
class Child:
    pid: int
    index: int
    generation: int
    heartbeat: str
    spawned_at: float
    ready: bool = False
    term_sent_at: float | None = None
    beat_mtime: float = 0.0
    """The heartbeat file's mtime when last looked at, and when (monotonic) it changed:
    a child's silence is measured on the monotonic clock, so a wall-clock step cannot
    make every child look hung."""
    beat_seen_at: float = 0.0


class Supervisor:
    """Forks, watches and replaces worker processes."""

    SIGNALS = ("HUP", "QUIT", "INT", "TERM", "TTIN", "TTOU", "CHLD", "TSTP", "CONT")

    def __init__(
        self,
        app: App,
        load: Callable[[], App],
        app_modules: set[str],
        settings: SupervisorSettings,
        worker_settings: WorkerSettings,
        child_setup: Callable[[int], None] | None = None,
    ) -> None:
        self.app = app
        self._load = load
        self._app_modules = app_modules
        self.settings = settings
        self.worker_settings = worker_settings
        self.target = settings.processes
        self.children: dict[int, Child] = {}
        self._child_setup = child_setup
        self._signals: list[int] = []
        self._pipe_r = self._pipe_w = -1
        self._stopping = False
        self._fast = False
        self._paused = False
        self._generation = 0
        self._next_index = 0
        self._deaths_in_a_row = 0
        self._next_spawn_at = 0.0
        self._exit_code = EXIT_OK
        self._halt: int | None = None
        self._dir = ""
        self._booted = False
        self._drained = False
        """Burst mode: a child exited 0 because the queues were empty."""
        self._stop_deadline = 0.0
        self.restarts = {"died": 0, "unresponsive": 0, "recycled": 0, "memory": 0}
        self.metrics = MetricsChild(app, directory=settings.metrics_dir,
                                    addr=settings.metrics_addr, port=settings.metrics_port,
                                    log_level=settings.log_level,
                                    log_format=settings.log_format, signals=self.SIGNALS,
                                    web=settings.web)

    # --- main loop -------------------------------------------------------------------

    def run(self) -> int:
        self._dir = tempfile.mkdtemp(prefix="batchq-hb-")
        self._pipe_r, self._pipe_w = os.pipe()
        for fd in (self._pipe_r, self._pipe_w):
            os.set_blocking(fd, False)
        for name in self.SIGNALS:
            signal.signal(getattr(signal, f"SIG{name}"), self._on_signal)
        log.info("supervisor %d starting %d worker processes", os.getpid(), self.target)
        try:
            while True:
                self._reap()
                self.metrics.publish_state(len(self.children), self.restarts)
                if self._halt is not None and not self._stopping:
                    # a child could not boot: stop the others, then exit with its code
                    self._exit_code = self._halt
                    self._stop(fast=True)
                if self._stopping:
                    if not self.children:
                        return self._exit_code
                    self._enforce_stop_deadline()
                else:
                    self._murder_unresponsive()
                    self._manage()
                    self.metrics.manage()
                    if self.worker_settings.burst and self._drained and not self.children:
                        if self._exit_code == EXIT_STALLED:
                            log.warning("burst: every worker finished, but jobs are left in "
                                        "paused queues (exit %d)", EXIT_STALLED)
                        else:
                            log.info("burst: every worker finished")
                        return self._exit_code
                self._sleep(0.2 if self._stopping else 1.0)
                while self._signals:
                    sig = self._signals.pop(0)
                    name = signal.Signals(sig).name.lower()
                    getattr(self, f"handle_{name[3:]}")()
        finally:
            self.metrics.stop()
            for name in self.SIGNALS:
                signal.signal(getattr(signal, f"SIG{name}"), signal.SIG_DFL)
            os.close(self._pipe_r)
            os.close(self._pipe_w)
            shutil.rmtree(self._dir, ignore_errors=True)

    def _on_signal(self, sig: int, frame: FrameType | None) -> None:
        if len(self._signals) < 10:
            self._signals.append(sig)
        with contextlib.suppress(OSError):
            os.write(self._pipe_w, b".")

    def _sleep(self, timeout_s: float) -> None:
        if self._signals:
            return
        with contextlib.suppress(InterruptedError, OSError):
            ready, _, _ = select.select([self._pipe_r], [], [], timeout_s)
            if ready:
                while os.read(self._pipe_r, 4096):
                    pass

    # --- signal handlers -------------------------------------------------------------

    def handle_chld(self) -> None:
        self._reap()

    def handle_term(self) -> None:
        if self._stopping:
            log.info("second SIGTERM: fast shutdown")
            self._stop(fast=True)
        else:
            log.info("SIGTERM: graceful shutdown (children drain)")
            self._stop(fast=False)

    def handle_int(self) -> None:
        log.info("SIGINT: fast shutdown")
        self._stop(fast=True)

    def handle_quit(self) -> None:
        log.info("SIGQUIT: fast shutdown")
        self._stop(fast=True)

    def handle_hup(self) -> None:
        if self._stopping:
            return
        self._generation += 1
        log.info("SIGHUP: rolling restart into generation %d (the app is imported afresh)",
                 self._generation)

    def handle_ttin(self) -> None:
        self.target += 1
        log.info("SIGTTIN: %d worker processes", self.target)

    def handle_ttou(self) -> None:
        if self.target > 1:
            self.target -= 1
        log.info("SIGTTOU: %d worker processes", self.target)

    def handle_tstp(self) -> None:
        self._paused = True
        log.info("SIGTSTP: workers stop fetching; jobs in flight keep running")
        self._kill_all(signal.SIGTSTP)

    def handle_cont(self) -> None:
        if self._paused:
            self._paused = False
            log.info("SIGCONT: workers fetch again")
            self._kill_all(signal.SIGCONT)

    # --- children --------------------------------------------------------------------

    def _stop(self, fast: bool) -> None:
        if self._stopping and (self._fast or not fast):
            return
        first = not self._stopping
        self._stopping = True
        self._fast = self._fast or fast
        grace = 2.0 if fast else self.worker_settings.shutdown_timeout_s + 5.0
        self._stop_deadline = time.monotonic() + grace
        sig = signal.SIGINT if fast else signal.SIGTERM
        if first or fast:
            self._kill_all(sig)

    def _enforce_stop_deadline(self) -> None:
        if time.monotonic() > self._stop_deadline and self.children:
            log.warning("%d workers still running after the shutdown timeout: SIGKILL",
                        len(self.children))
            self._kill_all(signal.SIGKILL)
            self._stop_deadline = time.monotonic() + 5.0

    def _kill_all(self, sig: int) -> None:
        for pid in list(self.children):
            self._kill(pid, sig)

    def _kill(self, pid: int, sig: int) -> None:
        try:
            os.kill(pid, sig)
        except OSError as exc:
            if exc.errno == errno.ESRCH:
                self.children.pop(pid, None)

    def _reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if pid == self.metrics.pid:
                self.metrics.on_exit(status, self._stopping)
                continue
            child = self.children.pop(pid, None)
            if child is None:
                log.debug("reaped pid %d (not a worker)", pid)
                continue
            if self.settings.metrics_dir:
                from prometheus_client import multiprocess

                multiprocess.mark_process_dead(  # type: ignore[no-untyped-call]
                    pid, self.settings.metrics_dir)
            self._on_exit(child, status)

    def _on_exit(self, child: Child, status: int) -> None:
        code = os.waitstatus_to_exitcode(status)
        ready = child.ready or self._is_ready(child)
        with contextlib.suppress(OSError):
            os.unlink(child.heartbeat)
        if self._stopping:
            log.info("worker %d (pid %d) exited (%d)", child.index, child.pid, code)
            return
        if code == EXIT_RECYCLED:
            log.info("worker %d (pid %d) recycled", child.index, child.pid)
            self.restarts["recycled"] += 1
            self._deaths_in_a_row = 0
            return
        if code == EXIT_MEMORY:
            log.warning("worker %d (pid %d) passed its memory cap (--max-memory-per-child "
                        "%d MB) and drained; replacing it", child.index, child.pid,
                        self.worker_settings.max_memory_mb or 0)
            self.restarts["memory"] += 1
            self._deaths_in_a_row = 0
            return
        if code == 0 or (code == EXIT_STALLED and self.worker_settings.burst):
            log.info("worker %d (pid %d) finished%s", child.index, child.pid,
                     " (stalled: jobs left only in paused queues)" if code else "")
            if self.worker_settings.burst:
                self._booted = self._drained = True
                if code == EXIT_STALLED:
                    self._exit_code = EXIT_STALLED
            self._deaths_in_a_row = 0
            return
        how = f"signal {signal.Signals(-code).name}" if code < 0 else f"exit code {code}"
        # on the first start any failure before the first heartbeat is a boot failure
        # (a bad setting, a crash at start): replacing the child would only crash again
        boot_code = code in (EXIT_IMPORT, EXIT_REDIS) or (code > 0 and not self._booted)
        if not ready and boot_code and (not self._booted or child.generation > 0):
            if child.generation > 0 and self._booted:
                log.error("worker %d of generation %d could not boot (%s): keeping the "
                          "running generation", child.index, child.generation, how)
                if child.generation == self._generation:
                    self._generation -= 1  # once per failed generation, not per child
                return
            log.error("worker %d could not boot (%s): stopping", child.index, how)
            self._halt = code
            return
        if self.worker_settings.burst and self._drained:
            # a burst child that died after another one found the queues empty may have
            # held jobs: replace it, so the run ends only when a worker again finds them
            # empty (never exit 0 with jobs reserved by a dead process)
            self._drained = False
        unresponsive = child.term_sent_at is not None and child.term_sent_at < time.monotonic()
        self.restarts["unresponsive" if unresponsive else "died"] += 1
        self._deaths_in_a_row += 1
        delay = min(self.settings.max_restart_backoff_s, 0.1 * 2 ** (self._deaths_in_a_row - 1))
        self._next_spawn_at = time.monotonic() + (delay if self._deaths_in_a_row > 1 else 0)
        log.warning("worker %d (pid %d) died (%s); replacing it%s", child.index, child.pid, how,
                    f" in {delay:.1f}s" if self._deaths_in_a_row > 1 else "")

    def _is_ready(self, child: Child) -> bool:
        if not child.ready:
            try:
                child.ready = os.stat(child.heartbeat).st_mtime > 1
            except OSError:
                return False
            if child.ready:
                self._booted = True
                self._deaths_in_a_row = 0
        return child.ready

    def _murder_unresponsive(self) -> None:
        timeout = self.settings.heartbeat_timeout_s
        now = time.monotonic()
        for child in list(self.children.values()):
            if not self._is_ready(child):
                if now - child.spawned_at > max(timeout, 60.0):
                    log.error("worker %d (pid %d) did not boot in time: SIGKILL", child.index,
                              child.pid)
                    self._kill(child.pid, signal.SIGKILL)
                continue
            try:
                mtime = os.stat(child.heartbeat).st_mtime
            except OSError:
                continue
            if mtime != child.beat_mtime:
                child.beat_mtime, child.beat_seen_at = mtime, now
            age = now - child.beat_seen_at
            if child.term_sent_at is not None:
                if now - child.term_sent_at > self.settings.kill_grace_s:
                    self._kill(child.pid, signal.SIGKILL)
            elif age > timeout and not self._paused:
                log.error("worker %d (pid %d) unresponsive for %.0fs (event loop blocked): "
                          "killing it; its jobs return when their leases expire",
                          child.index, child.pid, age)
                child.term_sent_at = now
                self._kill(child.pid, signal.SIGTERM)

    def _manage(self) -> None:
        gen = self._generation
        current = [c for c in self.children.values() if c.generation == gen]
        old = sorted((c for c in self.children.values() if c.generation != gen),
                     key=lambda c: c.spawned_at)
        # rolling restart: one old child goes for each new child that is ready
        ready_new = sum(1 for c in current if self._is_ready(c))
        draining = sum(1 for c in old if c.term_sent_at is not None)
        for c in old:
            if c.term_sent_at is None and draining < ready_new:
                c.term_sent_at = time.monotonic() + 1e9  # draining: not a hang
                self._kill(c.pid, signal.SIGTERM)
                draining += 1
        if self.worker_settings.burst and self._drained:
            return  # burst children are not replaced once one found the queues empty
        if len(current) < self.target and time.monotonic() >= self._next_spawn_at:
            for _ in range(self.target - len(current)):
                self._spawn(gen)
        elif len(current) > self.target:
            for c in sorted(current, key=lambda c: c.spawned_at)[: len(current) - self.target]:
                if c.term_sent_at is None:
                    c.term_sent_at = time.monotonic() + 1e9
                    self._kill(c.pid, signal.SIGTERM)

    def _spawn(self, generation: int) -> None:
        index = self._next_index
        self._next_index += 1
        hb = os.path.join(self._dir, f"w{index}")
        with open(hb, "wb"):
            pass
        os.utime(hb, (0, 0))
        pid = os.fork()
        if pid:
            self.children[pid] = Child(pid, index, generation, hb, time.monotonic())
            return
        code = EXIT_ERROR
        try:
            code = self._child_main(index, generation, hb)
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else EXIT_ERROR
        except BaseException:
            logging.getLogger("batchq.worker").exception("worker crashed")
        finally:
            with contextlib.suppress(Exception):
                logging.shutdown()
            os._exit(code)

    def _child_main(self, index: int, generation: int, heartbeat: str) -> int:
        for name in self.SIGNALS:
            signal.signal(getattr(signal, f"SIG{name}"), signal.SIG_DFL)
        # until the loop installs its handler, a TSTP must not stop this process
        signal.signal(signal.SIGTSTP, signal.SIG_IGN)
        os.close(self._pipe_r)
        os.close(self._pipe_w)
        from ..ops.logs import setup_logging

        setup_logging(self.settings.log_level, self.settings.log_format, f"worker-{index}")
        if self._child_setup is not None:
            self._child_setup(index)
        app = self.app
        if generation > 0:
            for name in self._app_modules:
                sys.modules.pop(name, None)
            from ..tasks.loading import AppImportError

            try:
                app = self._load()
            except AppImportError as exc:
                log.error("%s", exc)
                return EXIT_IMPORT
        app.redis_settings = self.app.redis_settings  # a --redis-url given to the CLI
        from . import run_worker

        settings = replace(self.worker_settings, heartbeat_path=heartbeat,
                           start_paused=self._paused,
                           supervisor_restarts=tuple(self.restarts.items()))
        import redis

        try:
            return run_worker(app, settings)
        except (redis.ConnectionError, redis.TimeoutError, OSError) as exc:
            log.error("cannot reach Redis: %s", exc)
            return EXIT_REDIS
