"""Absurd concurrency: ``-c`` is bounded (``MAX_CONCURRENCY``, 10,000), a worker at the
bound makes only the runners its jobs need, and stops on SIGTERM.

Before: ``worker -c 1000000000`` was accepted and made a runner per slot up front until
memory ran out ("Fatal Python error"); ``-c 1e20`` grew to 16 GB and ignored SIGTERM
(the loop never got to its signal handler). The programmatic ``WorkerSettings`` took
any number too.
"""

from __future__ import annotations

import asyncio
import signal
import time
from pathlib import Path

import pytest
import redis
from apps.basic import build
from helpers import drop_namespace, run_cli, start_cli, wait_until
from workers import wait_serving, worker_env

from batchq.worker import Worker, WorkerSettings
from batchq.worker.state import MAX_CONCURRENCY

pytestmark = pytest.mark.fault

JOBS = 300


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS for {pid}")


@pytest.mark.parametrize("bad", [0, -1, MAX_CONCURRENCY + 1, 10**9, 1e20, float("nan"),
                                 2**63, True, "100"])
def test_settings_refuse_concurrency_out_of_bounds(bad: object) -> None:
    with pytest.raises(ValueError, match=r"concurrency must be a whole number from 1 to "
                                         r"10,000"):
        WorkerSettings(concurrency=bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("flag", ["1000000000", "1e20", "10001"])
def test_cli_refuses_concurrency_over_the_bound_in_one_line(flag: str) -> None:
    res = run_cli(["worker", "apps.basic:app", "-c", flag], timeout_s=30,
                  env=worker_env({"BATCHQ_REDIS_URL": "redis://127.0.0.1:1/0"}))
    assert res.returncode == 2, res.stderr
    lines = res.stderr.strip().splitlines()
    assert any(flag in line for line in lines), res.stderr
    assert "Traceback" not in res.stderr


def test_runners_are_made_for_the_jobs_not_for_the_slots(redis_url: str, namespace: str,
                                                        queue_name: str,
                                                        redis_client: redis.Redis) -> None:
    app = build(redis_url, namespace)
    try:
        app.tasks["nap"].options(queue=queue_name).enqueue_many(
            [(f"n{i}", 0.3) for i in range(JOBS)])
        w = Worker(app, WorkerSettings(queues=(queue_name,), concurrency=MAX_CONCURRENCY,
                                       burst=True, install_signal_handlers=False,
                                       metrics=False))
        assert asyncio.run(w.run()) == 0
        made = len(w.state.runner_tasks)
        print(f"\n{JOBS} sleeping jobs at -c {MAX_CONCURRENCY}: {made} runners made")
        assert w.state.counters.fetched >= JOBS
        # a runner per job at most (they overlap: the jobs sleep), never one per slot
        assert 1 < made <= JOBS
        assert app.queue(queue_name).stats().ready == 0
    finally:
        app.close()
        drop_namespace(redis_client, namespace)


def test_worker_at_the_bound_starts_small_runs_jobs_and_stops_on_sigterm(
        redis_url: str, namespace: str, queue_name: str, redis_client: redis.Redis,
        tmp_path: Path) -> None:
    log_path = tmp_path / "runs.log"
    env = worker_env({"BATCHQ_REDIS_URL": redis_url, "BATCHQ_TEST_NS": namespace,
                      "BATCHQ_TEST_LOG": str(log_path)})
    small = start_cli(["worker", "apps.basic:app", "-q", queue_name, "-c", "1"], env=env)
    big = start_cli(["worker", "apps.basic:app", "-q", queue_name, "-c",
                     str(MAX_CONCURRENCY)], env=env)
    app = build(redis_url, namespace, str(log_path))
    try:
        wait_serving(small)
        wait_serving(big)
        time.sleep(0.5)
        extra_mb = _rss_mb(big.pid) - _rss_mb(small.pid)
        print(f"\nRSS at -c {MAX_CONCURRENCY} minus RSS at -c 1, idle: {extra_mb:.1f} MB")
        small.stop()
        # a runner per slot upfront cost ~10 MB here; made as jobs come, nothing
        assert extra_mb < 5, extra_mb
        app.tasks["nap"].options(queue=queue_name).enqueue_many(
            [(f"n{i}", 2.0) for i in range(JOBS)])

        def started() -> int:
            text = log_path.read_text() if log_path.exists() else ""
            return sum(1 for line in text.splitlines() if line.startswith("start "))

        wait_until(lambda: started() >= JOBS, 30, message="the jobs did not all start")
        big.send_signal(signal.SIGTERM)
        t0 = time.monotonic()
        assert big.wait(20) == 0, big.read_log()[-3000:]
        print(f"stopped {time.monotonic() - t0:.1f} s after SIGTERM with {JOBS} jobs running")
        assert app.queue(queue_name).stats().ready == 0
    finally:
        for p in (small, big):
            p.stop(signal.SIGKILL)
        app.close()
        drop_namespace(redis_client, namespace)
