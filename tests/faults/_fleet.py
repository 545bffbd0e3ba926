"""The fault tests' harness: worker fleets of ``faults.fault_app:app`` (on the shared
:class:`workers.WorkerFleet`), the processes they started and killed, a looping producer,
and the checker wired to one test's namespace.

The names the fault tests import from here stay importable here: ``Fleet``,
``Producer``, ``Produced``, ``build_app``, ``APP``, and the process helpers
``serving_pids``, ``alive`` and ``children``.
"""

from __future__ import annotations

import subprocess
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import checker
import redis
from helpers import CliProcess, alive, children
from workers import WorkerFleet, serving_pids

import batchq

from . import fault_app

__all__ = ["APP", "Fleet", "Produced", "Producer", "alive", "build_app", "children",
           "serving_pids"]

APP = "faults.fault_app:app"


# --- the harness -------------------------------------------------------------------------


class Fleet(WorkerFleet):
    """One test's namespace, run-record directory, producer app and processes."""

    def __init__(self, url: str, ns: str, runs_dir: Path, r: redis.Redis,
                 app: batchq.App) -> None:
        super().__init__(url, r, app, APP)
        self.ns = ns
        self.runs_dir = runs_dir

    # processes

    def app_env(self) -> dict[str, str | None]:
        return {"FAULT_NS": self.ns, "FAULT_RUNS": str(self.runs_dir)}

    def start(self, *flags: str, env: Mapping[str, str | None] | None = None,
              url: str | None = None, wait_ready: bool = True) -> CliProcess:
        """``batchq worker faults.fault_app:app *flags`` (``--metrics-port 0`` unless
        given, so a supervisor's children are its workers); waits until it serves
        unless ``wait_ready=False`` or ``--burst``."""
        return super().start(*flags, env=env, url=url, wait_ready=wait_ready)

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
