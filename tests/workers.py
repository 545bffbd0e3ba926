"""Worker processes of one test, shared by every test directory that starts them.

* :func:`worker_env`: the CLI's environment with every stray ``BATCHQ_*`` variable unset;
* :class:`WorkerProcs`: ``batchq worker APP ...`` processes, each waited for until it
  serves, SIGKILLed at teardown if still running (the ``start_worker`` fixtures of
  tests/fixtures/basic.py, tests/fixtures/cluster.py and tests/security are thin adapters over it);
* :class:`WorkerFleet`: the base of the fleet harnesses (tests/worker/test_supervisor.py,
  tests/fixtures/fleet.py): supervisors and their children found through ``/proc``, kills
  remembered, failure messages that show the queue and the logs.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Callable, Mapping
from pathlib import Path
from types import TracebackType
from typing import TypeVar

import redis
from helpers import CliProcess, alive, children, start_cli, wait_until

import batchq

T = TypeVar("T")

SERVING = " serving "
"""What a worker process logs once it serves: ``worker <host>:<pid> serving <queues>``."""


def worker_env(values: Mapping[str, str | None] | None = None) -> dict[str, str | None]:
    """The CLI's environment: ``values`` set, every other ``BATCHQ_*`` variable of this
    process unset (the CLI reads ``BATCHQ_<FLAG>``: the caller's must not leak in)."""
    env: dict[str, str | None] = {k: None for k in os.environ if k.startswith("BATCHQ_")}
    env.update(values or {})
    return env


def serving_pids(proc: CliProcess) -> set[int]:
    """Pids that logged ``worker <host>:<pid> serving ...`` (plain or JSON logs): worker
    processes, not a supervisor's metrics server."""
    out = set()
    for line in proc.read_log().splitlines():
        if SERVING in line and "worker " in line:
            tail = line.split(SERVING, 1)[0].rsplit(":", 1)[-1]
            if tail.isdigit():
                out.add(int(tail))
    return out


def wait_serving(proc: CliProcess, serving: int = 1, *, timeout_s: float = 30.0,
                 may_exit: bool = False) -> None:
    """Wait until ``serving`` worker processes of ``proc`` logged that they serve.

    Fails with the process's log if it exits first, unless ``may_exit`` (a ``--burst``
    worker may finish before the test looks)."""
    wait_until(lambda: proc.read_log().count(SERVING) >= serving or proc.poll() is not None,
               timeout_s=timeout_s, message=f"worker {proc.pid} did not start")
    assert may_exit or proc.poll() is None, proc.read_log()


class WorkerProcs:
    """``batchq worker <app_ref> ...`` processes started by one test.

    ``start(*args, env=None, serving=1)`` runs the worker with ``env`` (on top of the
    environment given here) and waits until ``serving`` processes serve (0: no wait; a
    ``--burst`` worker may exit meanwhile). :meth:`close` SIGKILLs any still running.
    """

    def __init__(self, app_ref: str, env: Mapping[str, str | None] | None = None) -> None:
        self.app_ref = app_ref
        self.env: dict[str, str | None] = dict(env or {})
        self.procs: list[CliProcess] = []

    def start(self, *args: str, env: Mapping[str, str | None] | None = None,
              serving: int = 1, timeout_s: float = 30.0) -> CliProcess:
        proc = start_cli(["worker", self.app_ref, *args], env={**self.env, **(env or {})})
        self.procs.append(proc)
        if serving:
            wait_serving(proc, serving, timeout_s=timeout_s, may_exit="--burst" in args)
        return proc

    def close(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                with contextlib.suppress(Exception):
                    p.stop(signal.SIGKILL, timeout_s=5)

    def __enter__(self) -> WorkerProcs:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


def cmdline(pid: int) -> str:
    """The command line of ``pid`` (space-separated), empty if it is gone."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


class WorkerFleet:
    """Supervisors and workers of one app started by one test, and what became of them.

    Subclasses add what their tests read (run records, the checker) and what the app
    reads from the environment (:meth:`app_env`). ``start`` runs ``batchq worker
    <app_ref>`` with :meth:`env`; a supervisor (``-p``) gets ``--metrics-port 0`` unless
    given, so its children are its workers.
    """

    metrics_port_always = False
    """Add ``--metrics-port 0`` to every start, not only to supervisors (``-p``)."""
    cleanup_signal: int = signal.SIGKILL
    """How :meth:`cleanup` stops a supervisor still running (SIGINT: a fast drain; a
    SIGKILL follows after 5 s)."""
    log_lines = 30
    """Lines of each process's log shown when a wait fails."""

    def __init__(self, url: str, r: redis.Redis, app: batchq.App, app_ref: str) -> None:
        self.url = url
        """The Redis URL the workers use (maybe a proxy's)."""
        self.r = r
        """A direct client (never through a proxy), for inspection."""
        self.app = app
        """The producer's app (same tasks as the workers')."""
        self.app_ref = app_ref
        """``module:attribute`` of the workers' app."""
        self.procs: list[CliProcess] = []
        self.killed: set[int] = set()
        """Pids this test SIGKILLed (a duplicate run may follow each)."""
        self.seen: set[int] = set()
        """Every child of a supervisor seen so far (killed at cleanup if it outlived
        it)."""

    # processes

    def app_env(self) -> dict[str, str | None]:
        """What the workers' app reads from the environment (namespace, record paths)."""
        return {}

    def env(self, extra: Mapping[str, str | None] | None = None,
            url: str | None = None) -> dict[str, str | None]:
        return worker_env({"BATCHQ_REDIS_URL": url or self.url, **self.app_env(),
                           **(extra or {})})

    def start(self, *flags: str, env: Mapping[str, str | None] | None = None,
              url: str | None = None, wait_ready: bool = False) -> CliProcess:
        """``batchq worker <app_ref> *flags``; ``wait_ready``: wait until one process
        serves (never for ``--burst``)."""
        if (self.metrics_port_always or "-p" in flags) and "--metrics-port" not in flags:
            flags = (*flags, "--metrics-port", "0")
        proc = start_cli(["worker", self.app_ref, *flags], env=self.env(env, url))
        self.procs.append(proc)
        if wait_ready and "--burst" not in flags:
            self.until(lambda: proc.poll() is not None or serving_pids(proc), 20,
                       f"worker {proc.pid} serving")
            assert proc.poll() is None, proc.read_log()
        return proc

    def children(self, proc: CliProcess) -> set[int]:
        kids = children(proc.pid)
        self.seen |= kids
        return kids

    def wait_children(self, proc: CliProcess, n: int, timeout_s: float = 20.0) -> set[int]:
        """Wait until the supervisor has ``n`` worker children, each of them serving, and
        no other child but its metrics server; returns the workers' pids."""

        def ready() -> set[int] | None:
            assert proc.poll() is None, f"supervisor exited {proc.returncode}\n" + \
                proc.read_log()[-3000:]
            kids = self.children(proc)
            workers = kids & serving_pids(proc)
            unknown = kids - workers - ({self.metrics_pid(proc)} - {None})
            return workers if len(workers) == n and not unknown else None

        return self.until(ready, timeout_s, f"{n} serving children of {proc.pid}")

    def workers(self, proc: CliProcess) -> set[int]:
        """The supervisor's live worker children (not its metrics server)."""
        return self.children(proc) & serving_pids(proc)

    def metrics_pid(self, proc: CliProcess) -> int | None:
        for line in proc.read_log().splitlines():
            if "[metrics " in line and "metrics on http" in line:
                pid = line.split("[metrics ", 1)[1].split("]", 1)[0]
                if pid.isdigit() and alive(int(pid)):
                    return int(pid)
        return None

    def is_ours(self, pid: int) -> bool:
        """``pid`` runs this fleet's app (a pid seen once may since have been reused)."""
        return self.app_ref in cmdline(pid)

    def kill(self, *pids: int) -> None:
        """SIGKILL, remembered for the checker (a duplicate may follow)."""
        for pid in pids:
            self.killed.add(pid)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    def kill_fleet(self, sup: CliProcess) -> set[int]:
        """kill -9 the supervisor and then each of its children (found before and after:
        a child the supervisor forked at the last moment is caught too)."""
        kids = self.children(sup)
        self.kill(sup.pid)
        sup.wait(10)
        kids |= {p for p in self.seen if alive(p) and self.is_ours(p)}
        self.kill(*kids)
        self.until(lambda: not any(alive(p) for p in kids), 10, "killed children gone")
        return kids | {sup.pid}

    def until(self, predicate: Callable[[], T], timeout_s: float, what: str,
              interval_s: float = 0.05) -> T:
        """``wait_until`` whose failure shows the queue and the logs as they are then."""
        try:
            return wait_until(predicate, timeout_s, interval_s)
        except AssertionError:
            raise AssertionError(f"{what} (within {timeout_s}s)\n{self.stats()}\n"
                                 f"{self.logs()}") from None

    def stats(self, queue: str = "default") -> batchq.QueueStats:
        return self.app.queue(queue).stats()

    def logs(self, lines: int | None = None) -> str:
        n = self.log_lines if lines is None else lines
        return "\n".join(log_tail(p, n) for p in self.procs)

    def cleanup(self) -> None:
        """Stop what this test started: supervisors, then any child that outlived its
        supervisor; close the producer's app."""
        for p in self.procs:
            if p.poll() is None:
                self.children(p)
                with contextlib.suppress(ProcessLookupError):
                    os.kill(p.pid, self.cleanup_signal)
                try:
                    p.wait(5)
                except subprocess.TimeoutExpired:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(p.pid, signal.SIGKILL)
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        p.wait(5)
        for pid in self.seen:
            if alive(pid) and self.is_ours(pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        self.app.close()


def log_tail(proc: CliProcess, lines: int = 40) -> str:
    """The last ``lines`` of a process's log, under a header naming it."""
    tail = "\n".join(proc.read_log().splitlines()[-lines:])
    return f"--- pid {proc.pid} (exit {proc.poll()}) ---\n{tail}"
