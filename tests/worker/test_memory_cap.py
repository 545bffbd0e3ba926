"""``batchq worker --max-memory-per-child MB``: a worker process whose RSS passes the cap
finishes its running jobs, gives back its prefetched ones and is replaced by the
supervisor. Real CLI, a handler that keeps 5 MB per job for ever (``apps.leak_app``),
the delivery checker over every run, the supervisor's metric and ``batchq info``."""

from __future__ import annotations

import json
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from apps import leak_app
from checker import check, read_runs, scrape
from helpers import free_port, run_cli, wait_until
from workers import WorkerFleet, log_tail

pytestmark = pytest.mark.e2e

APP = "apps.leak_app:app"

CAP_MB = 150
"""Above a fresh worker's RSS (about 50 MB), reached after 20 jobs or so."""


class Fleet(WorkerFleet):
    cleanup_signal = signal.SIGINT

    def __init__(self, url: str, r: redis.Redis, ns: str, runs_dir: Path) -> None:
        super().__init__(url, r, leak_app.build(url, ns), APP)
        self.ns = ns
        self.runs_dir = runs_dir

    def app_env(self) -> dict[str, str | None]:
        return {"LEAK_NS": self.ns, "LEAK_RUNS": str(self.runs_dir)}


@pytest.fixture
def fleet(redis_url: str, redis_client: redis.Redis, namespace: str,
          tmp_path: Path) -> Iterator[Fleet]:
    f = Fleet(redis_url, redis_client, namespace, tmp_path)
    try:
        yield f
    finally:
        f.cleanup()
        f.app.close()


def test_a_leaking_worker_is_replaced_and_no_job_is_lost(fleet: Fleet) -> None:
    tokens = [f"t{i}" for i in range(80)]
    fleet.app.tasks["leak"].enqueue_many([(t, 0.15) for t in tokens])
    mport = free_port()
    # -c 2 with batches of 10: a capped worker holds prefetched jobs it must give back
    sup = fleet.start("-p", "1", "-c", "2", "--fetch-batch", "10",
                      "--max-memory-per-child", str(CAP_MB), "--metrics-port", str(mport))
    q = fleet.app.queue()
    fleet.until(lambda: q.stats().pending == 0 and len(read_runs(fleet.runs_dir)) >= 80,
                60, "every job ran")
    runs = read_runs(fleet.runs_dir)
    report = check(tokens, runs, dead=())
    assert report.valid and not report.lost and not report.duplicated, report
    assert all(r.completed for r in runs), "a run was cut short"
    pids = {r.pid for r in runs}
    assert len(pids) >= 3, f"the children were not replaced: {pids}\n{log_tail(sup)}"
    assert sup.poll() is None
    st = q.stats()
    assert (st.ready, st.reserved, st.delayed, st.dead) == (0, 0, 0, 0), st

    out = sup.read_log()
    assert out.count("memory cap: RSS") >= len(pids) - 1, out
    assert "passed its memory cap (--max-memory-per-child 150 MB) and drained; " \
        "replacing it" in out, out
    assert " died " not in out and "Traceback" not in out, out

    def memory_restarts() -> float:
        for line in scrape(mport).splitlines():
            if line.startswith('batchq_worker_restarts_total{reason="memory"}'):
                return float(line.split()[-1])
        return -1.0

    wait_until(lambda: memory_restarts() >= len(pids) - 1, timeout_s=10,
               message="batchq_worker_restarts_total{reason=\"memory\"}")
    body = scrape(mport)
    assert 'batchq_worker_restarts_total{reason="died"} 0.0' in body

    env = fleet.env({"BATCHQ_NAMESPACE": fleet.ns})
    wait_until(lambda: json.loads(run_cli(["info", "--json"], env=env).stdout)["workers"]
               [0].get("restarts", {}).get("memory", 0) >= 1, timeout_s=15,
               message="info shows the memory restarts")
    text = run_cli(["info"], env=env).stdout
    assert "(memory)" in text and "its supervisor had replaced" in text, text

    assert sup.stop(signal.SIGTERM, timeout_s=30) == 0, log_tail(sup)


def test_a_cap_below_a_fresh_worker_exits_2(fleet: Fleet) -> None:
    env = fleet.env()
    res = run_cli(["worker", APP, "-p", "1", "--max-memory-per-child", "5"], env=env)
    assert res.returncode == 2, res
    err = res.stderr.strip().splitlines()
    assert any("--max-memory-per-child 5 MB: this process already uses" in x
               for x in err), res.stderr
    assert "Traceback" not in res.stderr
    for bad in ("0", "-3", "many", str(1 << 21)):
        res = run_cli(["worker", APP, "--max-memory-per-child", bad], env=env)
        assert res.returncode == 2 and "--max-memory-per-child" in res.stderr, res
        assert len(res.stderr.strip().splitlines()) == 1, res.stderr
