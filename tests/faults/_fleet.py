"""The fault tests' harness: worker fleets of ``faults.fault_app:app``, the processes they
started and killed, a looping producer, and the checker wired to one test's namespace."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import checker
import redis
from helpers import CliProcess, alive, children, start_cli, wait_until

import batchq

from . import fault_app

APP = "faults.fault_app:app"
T = TypeVar("T")


# --- processes ---------------------------------------------------------------------------


def serving_pids(proc: CliProcess) -> set[int]:
    """Pids that logged ``worker <host>:<pid> serving ...``: worker processes, not the
    supervisor's metrics server."""
    out = set()
    for line in proc.read_log().splitlines():
        if " serving " in line and "worker " in line:
            tail = line.split(" serving ", 1)[0].rsplit(":", 1)[-1]
            if tail.isdigit():
                out.add(int(tail))
    return out


# --- the harness -------------------------------------------------------------------------


@dataclass
class Fleet:
    """One test's namespace, run-record directory, producer app and processes."""

    url: str
    """The Redis URL the workers use (maybe a proxy's)."""
    ns: str
    runs_dir: Path
    r: redis.Redis
    """A direct client (never through a proxy), for inspection."""
    app: batchq.App
    """The producer's app (same tasks as the workers'; it records nothing)."""
    procs: list[CliProcess] = field(default_factory=list)
    killed: set[int] = field(default_factory=set)
    seen: set[int] = field(default_factory=set)

    # processes

    def env(self, extra: dict[str, str | None] | None = None,
            url: str | None = None) -> dict[str, str | None]:
        env: dict[str, str | None] = {k: None for k in os.environ if k.startswith("BATCHQ_")}
        env.update({"BATCHQ_REDIS_URL": url or self.url, "FAULT_NS": self.ns,
                    "FAULT_RUNS": str(self.runs_dir)})
        env.update(extra or {})
        return env

    def start(self, *flags: str, env: dict[str, str | None] | None = None,
              url: str | None = None, wait_ready: bool = True) -> CliProcess:
        """``batchq worker faults.fault_app:app *flags`` (``--metrics-port 0`` unless
        given, so a supervisor's children are its workers)."""
        if "-p" in flags and "--metrics-port" not in flags:
            flags = (*flags, "--metrics-port", "0")
        proc = start_cli(["worker", APP, *flags], env=self.env(env, url))
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
        """Wait until the supervisor has ``n`` worker children, each of them serving (its
        metrics server aside); returns their pids."""

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
        kids |= {p for p in self.seen if alive(p) and _is_ours(p)}
        self.kill(*kids)
        self.until(lambda: not any(alive(p) for p in kids), 10, "killed children gone")
        return kids | {sup.pid}

    def drain(self, *flags: str, timeout_s: float = 60.0,
              env: dict[str, str | None] | None = None) -> CliProcess:
        """Run a ``--burst`` fleet to completion (fails the test if it does not exit 0)."""
        proc = self.start(*flags, "--burst", env=env)
        try:
            code = proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"burst worker still running after {timeout_s}s\n"
                                 f"{self.stats()}\n{proc.read_log()[-4000:]}") from None
        assert code == 0, proc.read_log()[-4000:]
        return proc

    def until(self, predicate: Callable[[], T], timeout_s: float, what: str,
              interval_s: float = 0.05) -> T:
        try:
            return wait_until(predicate, timeout_s, interval_s)
        except AssertionError:
            raise AssertionError(f"{what} (within {timeout_s}s)\n{self.stats()}\n"
                                 f"{self.logs()}") from None

    def logs(self, lines: int = 30) -> str:
        out = []
        for p in self.procs:
            tail = "\n".join(p.read_log().splitlines()[-lines:])
            out.append(f"--- pid {p.pid} (exit {p.poll()}) ---\n{tail}")
        return "\n".join(out)

    def cleanup(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                self.children(p)
                with contextlib.suppress(ProcessLookupError):
                    os.kill(p.pid, signal.SIGKILL)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    p.wait(5)
        for pid in self.seen:  # children that outlived their supervisor
            if alive(pid) and _is_ours(pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        self.app.close()

    # what happened

    def runs(self) -> list[checker.Run]:
        return checker.read_runs(self.runs_dir)

    def completed(self) -> set[str]:
        return {r.token for r in self.runs() if r.completed}

    def wait_completed(self, tokens: Iterable[str], timeout_s: float = 30.0) -> None:
        want = set(tokens)
        self.until(lambda: want <= self.completed(), timeout_s, f"{len(want)} jobs completed")

    def settle(self, queues: Sequence[str] = ("default",), timeout_s: float = 30.0) -> None:
        """Wait until nothing is ready, delayed, reserved or in flight: every lease of a
        dead worker has expired and its job ran again (only then is the record final)."""

        def done() -> bool:
            for q in queues:
                if self.stats(q).pending or self.r.hlen(self.app.keys(q).inflight):
                    return False
            return True

        self.until(done, timeout_s, "queues settled", interval_s=0.1)

    def stats(self, queue: str = "default") -> batchq.QueueStats:
        return self.app.queue(queue).stats()

    def check(self, enqueued: Iterable[str], queues: Sequence[str] = ("default",),
              **kw: Any) -> checker.Report:
        dead: dict[str, str] = {}
        for q in queues:
            dead.update(checker.dead_tokens(self.app.queue(q)))
        kw.setdefault("killed_pids", self.killed)
        return checker.check(enqueued, self.runs(), dead, **kw)

    def reconcile(self, port: int, queue: str = "default", *, allow_stale: bool = False,
                  timeout_s: float = 10.0) -> checker.Reconciliation:
        """Poll ``/metrics`` until it reconciles (the workers publish once a second);
        ``allow_stale``: off by no more than the stale acks (see
        ``Reconciliation.ok_but_stale``)."""
        deadline = time.monotonic() + timeout_s
        last: checker.Reconciliation | str = "no scrape"
        while True:
            try:
                rec = checker.reconcile(checker.scrape(port), queue)
            except OSError as exc:
                last = f"scrape failed: {exc}"
            else:
                last = rec
                if rec.enqueued > 0 and (rec.ok or (allow_stale and rec.ok_but_stale)):
                    return rec
            if time.monotonic() > deadline:
                raise AssertionError(f"/metrics does not reconcile: {last}")
            time.sleep(0.2)

    def leftovers(self, queues: Sequence[str] = ("default",), **kw: Any) -> list[str]:
        return checker.leftovers(self.r, self.ns, queues, **kw)


def _is_ours(pid: int) -> bool:
    try:
        return APP in Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return False


def build_app(url: str, ns: str, **kw: Any) -> batchq.App:
    """A producer-side copy of the fault app (records nothing)."""
    return fault_app.build(url, ns, None, **kw)


# --- a producer that enqueues in a loop through a fault ---------------------------------


@dataclass
class Produced:
    enqueued: list[str] = field(default_factory=list)
    """Tokens whose enqueue returned."""
    maybe: list[str] = field(default_factory=list)
    """EnqueueError with ``unknown``: may or may not have been written."""
    refused: list[str] = field(default_factory=list)
    """EnqueueError with nothing unknown: not written."""
    retried: set[str] = field(default_factory=set)
    """Calls slow enough to have been retried (the retry may write twice; see README)."""
    escaped: list[str] = field(default_factory=list)
    """Anything but EnqueueError raised by enqueue: a bug."""
    errors: list[tuple[float, float, str]] = field(default_factory=list)
    """(start, end, message) of each failed call, real time."""

    @property
    def attempted(self) -> int:
        return len(self.enqueued) + len(self.maybe) + len(self.refused) + len(self.escaped)


class Producer(threading.Thread):
    """Enqueues ``work(token, secs)`` jobs in a loop until stopped: one ``enqueue`` per
    call, every ``many_every``-th call an ``enqueue_many`` of ``many`` jobs (one chunk:
    the reconnect-safe path). Records only what each call reported."""

    def __init__(self, app: batchq.App, prefix: str, *, secs: float = 0.0,
                 pause_s: float = 0.002, many_every: int = 5, many: int = 5,
                 task: str = "work", queue: str | None = None) -> None:
        super().__init__(name=f"producer-{prefix}", daemon=True)
        t = app.tasks[task]
        self.task = t.options(queue=queue) if queue else t
        self.prefix = prefix
        self.secs = secs
        self.pause_s = pause_s
        self.many_every = many_every
        self.many = many
        self.out = Produced()
        self._halt = threading.Event()
        self._n = 0

    def stop(self) -> Produced:
        self._halt.set()
        self.join(60)
        assert not self.is_alive(), "producer stuck"
        return self.out

    def _tokens(self, n: int) -> list[str]:
        toks = [f"{self.prefix}{self._n + i}" for i in range(n)]
        self._n += n
        return toks

    def run(self) -> None:
        calls = 0
        while not self._halt.is_set():
            calls += 1
            many = self.many_every and calls % self.many_every == 0
            toks = self._tokens(self.many if many else 1)
            t0 = fault_app.now()
            try:
                if many:
                    self.task.enqueue_many([(t, self.secs) for t in toks])
                else:
                    self.task.enqueue(toks[0], self.secs)
            except batchq.EnqueueError as exc:
                t1 = fault_app.now()
                self.out.errors.append((t0, t1, str(exc)))
                written = set()
                for jid_tok in zip(exc.ids, toks, strict=False):
                    written.add(jid_tok[1])  # single-chunk calls: all or nothing
                self.out.enqueued += [t for t in toks if t in written]
                rest = [t for t in toks if t not in written]
                (self.out.maybe if exc.unknown else self.out.refused).extend(rest)
                if t1 - t0 >= 0.045:
                    self.out.retried.update(toks)
                time.sleep(0.05)
                continue
            except Exception as exc:
                self.out.escaped += toks
                self.out.errors.append((t0, fault_app.now(), f"{type(exc).__name__}: {exc}"))
                time.sleep(0.05)
                continue
            if fault_app.now() - t0 >= 0.045:
                self.out.retried.update(toks)
            self.out.enqueued += toks
            if self.pause_s:
                time.sleep(self.pause_s)
