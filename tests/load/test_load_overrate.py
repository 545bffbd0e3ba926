"""A load run at a rate its producers cannot send: refused up front, or (``--force``)
stopped at its duration, its queued jobs skipped, and reported incomplete.

Before: ``bench load --rate 1e9 --duration 1`` was accepted; the producer sent ~50,000
jobs/s for 63 s (until the 60 s grace after the schedule), left 3.1 M jobs in the queue,
printed stack dumps and reported "status complete".

The real CLI in subprocesses, a real worker process of ``bench.loadtest.app`` (its
``sleep_ms`` task), the session's Redis.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

pytestmark = pytest.mark.fault

REPO = Path(__file__).resolve().parent.parent.parent
APP = "bench.loadtest.app:app"
QUEUE = "loadtest"
RATE = "1000000"  # the highest --rate the flag takes; one producer sends far fewer
DURATION_S = 1.0
SETTLE_S = 3.0


def _env(redis_url: str, ns: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("BATCHQ_")}
    env.update(BATCHQ_REDIS_URL=redis_url, LOADTEST_NS=ns,
               PYTHONPATH=os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]))
    return env


def _load(env: dict[str, str], *args: str, timeout_s: float = 90
          ) -> tuple[subprocess.CompletedProcess[str], float]:
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "batchq", "bench", "load", APP, *args],
                          cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=timeout_s, stdin=subprocess.DEVNULL)
    return proc, time.monotonic() - t0


def _queued(r: redis.Redis, ns: str) -> int:
    tag = f"{ns}:{{{ns}:{QUEUE}}}"
    return sum(int(r.llen(f"{tag}:ready:{p}")) for p in range(10)) + int(
        r.zcard(f"{tag}:delayed"))


@pytest.fixture
def ns(redis_client: redis.Redis) -> Iterator[str]:
    name = f"lo{uuid.uuid4().hex[:8]}"
    yield name
    for key in redis_client.scan_iter(f"{name}:*", count=1000):
        redis_client.delete(key)
    for key in redis_client.scan_iter("batchq-calibrate-*", count=1000):
        redis_client.delete(key)


@pytest.mark.parametrize("rate", ["1e9", "inf", "nan", "0", "-5"])
def test_a_rate_beyond_the_flag_is_one_line_and_exit_2(redis_url: str, ns: str,
                                                       rate: str) -> None:
    proc, _ = _load(_env(redis_url, ns), "sleep_ms", "--rate", rate, "--duration", "1",
                    "--args", "[1]")
    assert proc.returncode == 2, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 or "usage:" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr


def test_an_unreachable_rate_is_refused_before_anything_is_sent(
        redis_url: str, ns: str, redis_client: redis.Redis) -> None:
    proc, took_s = _load(_env(redis_url, ns), "sleep_ms", "--rate", RATE, "--duration",
                         str(DURATION_S), "--args", "[1]")
    print(f"\n{proc.stderr.strip()} ({took_s:.1f} s)")
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    (line,) = proc.stderr.strip().splitlines()
    assert "jobs/s" in line and "measured" in line and "--force" in line, line
    assert _queued(redis_client, ns) == 0
    assert not list(redis_client.scan_iter(f"{ns}:*")), "the run was opened"
    assert not list(redis_client.scan_iter("batchq-calibrate-*")), "calibration left keys"


def test_a_forced_unreachable_rate_ends_on_time_incomplete_and_leaves_no_jobs(
        redis_url: str, ns: str, redis_client: redis.Redis) -> None:
    env = _env(redis_url, ns)
    worker = subprocess.Popen([sys.executable, "-m", "batchq", "worker", APP, "-c", "200",
                               "--no-metrics", "--log-level", "WARNING"], cwd=REPO, env=env,
                              stdin=subprocess.DEVNULL)
    try:
        proc, took_s = _load(env, "sleep_ms", "--rate", RATE, "--duration",
                             str(DURATION_S), "--args", "[1]", "--settle", str(SETTLE_S),
                             "--force", "--json")
        assert proc.stdout, proc.stderr
        report = json.loads(proc.stdout)
        print(f"\nforced --rate {RATE} --duration {DURATION_S:g}: ended in {took_s:.1f} s, "
              f"sent {report['sent']:,}; {report['status']}: {report['reason']}")
        assert proc.returncode == 1, proc.stderr
        assert "Traceback" not in proc.stderr and "Thread 0x" not in proc.stderr, \
            proc.stderr[-3000:]
        assert report["status"] == "incomplete"
        assert "could not keep the schedule" in report["reason"]
        assert 0 < report["sent"] < float(RATE) * DURATION_S
        # lead (2 s) + duration + the producers' grace (2 s) + settle + the leftovers'
        # wait (10 s at most) + start-up and calibration: far from the minute it took
        assert took_s < 2 + DURATION_S + 2 + SETTLE_S + 10 + 15, took_s
        # the jobs left in the queue were skipped by the worker, not run
        assert _queued(redis_client, ns) == 0
    finally:
        worker.terminate()
        worker.wait(30)
