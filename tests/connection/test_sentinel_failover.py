"""Failover under Sentinel: a real Valkey primary, replicas and three Sentinels
(``batchq.dev.sentinel``), a producer enqueueing and a ``-p 2`` fleet of the real CLI
draining through a ``redis+sentinel://`` URL.

* the primary SIGKILLed mid-run, ``LAG_S`` after its replicas stopped hearing it (a
  proxy between them drops the stream), a replica promoted (two replicas, so one is
  left to confirm writes after the failover): with ``min_replicas=1`` every job
  whose enqueue returned runs (lost 0); without it the checker counts what was lost. Both
  print the loss and the resume time (kill -> first job enqueued after the kill done);
* a Sentinel killed: nothing happens;
* the primary demoted while the fleet works (``SENTINEL FAILOVER``: the Sentinels send
  it ``REPLICAOF``): the workers get ``READONLY``, find the new primary and carry on,
  without a crash and without hammering the old primary.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
from apps import fault_app
from fixtures.faults import *  # noqa: F403
from fixtures.fleet import Fleet, Produced, build_app
from fixtures.proxy import Proxy

import batchq
from batchq.dev.sentinel import EmbeddedSentinels
from batchq.store.connection import RedisSettings

pytestmark = pytest.mark.fault


class _Producer(threading.Thread):
    """Enqueues ``work(token, secs)`` one at a time until stopped. A ``NotReplicated``
    job is counted as *maybe* (it may or may not survive), an ``EnqueueError`` with an
    unknown outcome too; ``began`` keeps when each call that returned began."""

    def __init__(self, app: batchq.App, prefix: str, secs: float = 0.01,
                 delay_s: float = 0.0) -> None:
        super().__init__(daemon=True)
        work = app.tasks["work"]
        self.task = work.options(delay_s=delay_s) if delay_s else work
        self.prefix, self.secs = prefix, secs
        self.out = Produced()
        self.began: dict[str, float] = {}
        self.not_replicated = 0
        self._halt = threading.Event()

    def run(self) -> None:
        n = 0
        while not self._halt.is_set():
            tok = f"{self.prefix}{n}"
            n += 1
            t0 = fault_app.now()
            try:
                self.task.enqueue(tok, self.secs)
            except batchq.NotReplicated as exc:
                self.not_replicated += 1
                self.out.maybe.append(tok)
                self.out.errors.append((t0, fault_app.now(), str(exc)))
                continue
            except batchq.EnqueueError as exc:
                (self.out.maybe if exc.unknown else self.out.refused).append(tok)
                self.out.errors.append((t0, fault_app.now(), str(exc)))
                time.sleep(0.05)
                continue
            except Exception as exc:  # a bug: anything else must not escape enqueue
                self.out.escaped.append(tok)
                self.out.errors.append((t0, fault_app.now(), f"{type(exc).__name__}: {exc}"))
                time.sleep(0.05)
                continue
            t1 = fault_app.now()
            if t1 - t0 >= 0.045:
                self.out.retried.add(tok)
            self.out.enqueued.append(tok)
            self.began[tok] = t0
            time.sleep(0.002)

    def stop(self) -> Produced:
        self._halt.set()
        self.join(60)
        assert not self.is_alive(), "producer stuck"
        return self.out


def _fleet(s: EmbeddedSentinels, ns: str, runs: Path, min_replicas: int) -> Fleet:
    r = RedisSettings(s.url).sync_client()  # follows the primary, as the workers do
    return Fleet(s.url, ns, runs, r, build_app(s.url, ns, min_replicas=min_replicas))


LAG_S = 0.3
"""Replication lag at the kill: the replicas' stream is dropped (a proxy's blackhole) this
long before the primary dies, as a slow link or a busy replica would delay it."""

DELAY_S = 0.5
"""Every job waits this long in Redis before it may run, so the jobs of the lag window
are still waiting at the kill (a fleet that runs a job the moment it lands would hide a
lost write: the job ran, on the old primary)."""


def _failover_run(namespace: str, tmp_path: Path, min_replicas: int) -> dict[str, Any]:
    """One run of the kill -9 scenario; returns its figures (asserting what always holds)."""
    runs = tmp_path / "runs"
    runs.mkdir()
    proxies: list[Proxy] = []

    def via(port: int) -> int:
        proxies.append(Proxy(port).start())
        return proxies[-1].port

    with EmbeddedSentinels(replicas=2, replica_via=via) as s:
        fleet = _fleet(s, namespace, runs, min_replicas)
        try:
            env = {"FAULT_MIN_REPLICAS": str(min_replicas)}
            sup = fleet.start("-p", "2", "-c", "20", "--lease-s", "5", env=env)
            kids = fleet.wait_children(sup, 2, timeout_s=30)
            prod = _Producer(fleet.app, "f", delay_s=DELAY_S)
            prod.start()
            fleet.until(lambda: len(prod.out.enqueued) >= 300 and len(fleet.completed()) >= 100,
                        30, "jobs flowing")

            proxies[0].blackhole()  # the replicas stop hearing the primary
            time.sleep(LAG_S)
            t_kill = fault_app.now()
            old = s.kill_primary()
            proxies[0].blackhole(False)
            s.wait_failover(old.port, timeout_s=30)
            t_promoted = fault_app.now()
            # the other replica follows the new primary: min_replicas=1 is met again
            after = len(prod.out.enqueued)
            fleet.until(lambda: len(prod.out.enqueued) >= after + 300, 30,
                        "enqueues succeed after the failover")
            out = prod.stop()
            fleet.settle(timeout_s=60)

            assert out.escaped == [], out.errors[:5]
            assert fleet.workers(sup) == kids, "a worker died instead of following the failover"
            assert "Traceback" not in sup.read_log(), sup.read_log()[-3000:]
            report = fleet.check(out.enqueued, maybe=out.maybe, retried_enqueues=out.retried,
                                 attempted=out.attempted,
                                 # a failover undoes pops and acks the replica never got:
                                 # those jobs run again, as after an expired lease
                                 expired_leases_possible=True)
            # resumed: the first job whose enqueue began after the kill has run (less
            # the delay every job waits)
            ends = [r.end for r in fleet.runs() if r.completed and r.token in prod.began
                    and prod.began[r.token] > t_kill and r.end is not None]
            resume_s = min(ends) - t_kill - DELAY_S if ends else float("nan")
            figures = {"min_replicas": min_replicas, "enqueued": len(out.enqueued),
                       "maybe": len(out.maybe), "not_replicated": prod.not_replicated,
                       "lost": len(report.lost), "duplicated": len(report.duplicated),
                       "promoted_s": round(t_promoted - t_kill, 2),
                       "resume_s": round(resume_s, 2), "report": report}
            print(f"\nfailover min_replicas={min_replicas}: {report.summary()}; "
                  f"promoted after {figures['promoted_s']}s, fleet resumed after "
                  f"{figures['resume_s']}s; NotReplicated {prod.not_replicated}")
            return figures
        finally:
            fleet.cleanup()
            for p in proxies:
                p.stop()


@pytest.mark.slow
def test_failover_with_min_replicas_loses_no_acknowledged_enqueue(namespace: str,
                                                                   tmp_path: Path) -> None:
    figures = _failover_run(namespace, tmp_path, 1)
    report = figures["report"]
    assert report.lost == [], report.details()
    assert report.valid, report.details()
    assert figures["resume_s"] < 30, figures


@pytest.mark.slow
def test_failover_without_min_replicas_reports_the_loss(namespace: str,
                                                        tmp_path: Path) -> None:
    figures = _failover_run(namespace, tmp_path, 0)
    report = figures["report"]
    # lost: what the replicas had not received at the kill (the last LAG_S of
    # acknowledged enqueues); nothing else may go wrong (no unexplained duplicate, no
    # unexpected run)
    assert report.lost, "the lag window lost nothing: the scenario did not lag"
    assert not report.unexpected and not report.unexplained, report.details()
    assert figures["resume_s"] < 30, figures


def test_a_sentinel_killed_changes_nothing(namespace: str, tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    runs.mkdir()
    with EmbeddedSentinels() as s:
        fleet = _fleet(s, namespace, runs, 0)
        try:
            sup = fleet.start("-c", "20", wait_ready=True)
            first = fleet.app.tasks["work"].enqueue_many([(f"a{i}", 0) for i in range(200)])
            fleet.wait_completed([f"a{i}" for i in range(200)])
            s.kill_sentinel(0)
            # a process started now asks the Sentinels that are left
            late = build_app(s.url, namespace)
            late.tasks["work"].enqueue_many([(f"b{i}", 0) for i in range(200)])
            fleet.wait_completed([f"b{i}" for i in range(200)])
            assert sup.poll() is None
            assert "Traceback" not in sup.read_log()
            report = fleet.check([f"a{i}" for i in range(200)] + [f"b{i}" for i in range(200)])
            assert report.valid and len(first) == 200, report.details()
        finally:
            fleet.cleanup()


@pytest.mark.slow
def test_demoted_primary_readonly_worker_rediscovers(namespace: str, tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    runs.mkdir()
    with EmbeddedSentinels() as s:
        fleet = _fleet(s, namespace, runs, 0)
        try:
            sup = fleet.start("-c", "20", wait_ready=True)
            old = s.primary
            assert old is not None
            prod = _Producer(fleet.app, "d", secs=0.005)
            prod.start()
            fleet.until(lambda: len(fleet.completed()) >= 100, 30, "jobs flowing")
            # the Sentinels promote the replica and send the old primary REPLICAOF: it
            # stays up and answers every write with READONLY
            s.sentinel_client(0).execute_command("SENTINEL", "FAILOVER", s.service)
            s.wait_failover(old.port, timeout_s=30)
            after = len(prod.out.enqueued)
            fleet.until(lambda: len(prod.out.enqueued) >= after + 300, 30,
                        "enqueues reach the new primary")
            out = prod.stop()
            fleet.wait_completed(out.enqueued, timeout_s=60)
            fleet.settle(timeout_s=60)
            assert sup.poll() is None, sup.read_log()[-3000:]
            assert "Traceback" not in sup.read_log(), sup.read_log()[-3000:]
            assert out.escaped == [], out.errors[:5]
            # READONLY drops the connection and the next one asks the Sentinels: a few
            # replies per client, not a loop against the demoted server
            import redis

            demoted = redis.Redis.from_url(old.url)
            ro = demoted.info("errorstats").get("errorstat_READONLY", {}).get("count", 0)
            assert demoted.role()[0] in (b"slave", "slave")
            assert ro < 200, f"{ro} READONLY replies: a busy loop against the old primary"
            time.sleep(1.0)
            ro_later = demoted.info("errorstats").get("errorstat_READONLY", {}).get("count", 0)
            assert ro_later == ro, "still writing to the demoted primary"
            report = fleet.check(out.enqueued, maybe=out.maybe, retried_enqueues=out.retried,
                                 expired_leases_possible=True)
            print(f"\nREADONLY demotion: {report.summary()}; READONLY replies {ro}")
            assert report.valid, report.details()
        finally:
            fleet.cleanup()

