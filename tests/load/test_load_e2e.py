"""``batchq bench load`` end to end: a local HTTP target (``bench.loadtest.target``),
real worker processes running ``bench.loadtest.app``, and the real CLI in subprocesses
(so exit codes, ``--producers`` children and ``--join`` are the user's)."""

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

from batchq.store.keys import load_keys

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parent.parent.parent
APP = "bench.loadtest.app:app"
JSON_KEYS = {"offered_rate", "achieved_rate", "sent", "errors", "errors_by_type", "run_ms",
             "start_ms", "done_ms", "timeline", "status", "reason"}
PCT_KEYS = ["p50", "p90", "p99", "p999", "max"]


def _env(redis_url: str, ns: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("BATCHQ_")}
    env.update(BATCHQ_REDIS_URL=redis_url, LOADTEST_NS=ns,
               PYTHONPATH=os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]))
    return env


def _target(args: list[str]) -> tuple[subprocess.Popen[str], str]:
    p = subprocess.Popen([sys.executable, "-m", "bench.loadtest.target", *args],
                         cwd=REPO, stdout=subprocess.PIPE, text=True,
                         stdin=subprocess.DEVNULL)
    assert p.stdout is not None
    line = p.stdout.readline()
    assert line.startswith("listening on "), line
    return p, line.split()[-1]


@pytest.fixture(scope="module")
def fleet(redis_url: str) -> Iterator[dict[str, str]]:
    """A fast target (20 ms, 200 slots), a slow one (20 ms, 2 slots: knee at 100/s) and
    two worker processes; yields the environment and the targets' URLs."""
    ns = f"lt{uuid.uuid4().hex[:8]}"
    env = _env(redis_url, ns)
    fast, fast_url = _target(["--latency-ms", "20", "--capacity", "200"])
    slow, slow_url = _target(["--latency-ms", "20", "--capacity", "2", "--max-queue", "10000"])
    workers = [subprocess.Popen(
        [sys.executable, "-m", "batchq", "worker", APP, "-c", "100", "--no-metrics",
         "--log-level", "WARNING"], cwd=REPO, env=env, stdin=subprocess.DEVNULL)
        for _ in range(2)]
    try:
        yield {"ns": ns, "fast": fast_url, "slow": slow_url, "redis_url": redis_url,
               **{f"env:{k}": v for k, v in env.items()}}
    finally:
        for p in (*workers, fast, slow):
            p.terminate()
        for p in (*workers, fast, slow):
            p.wait(timeout=30)


def _env_of(fleet: dict[str, str]) -> dict[str, str]:
    return {k[4:]: v for k, v in fleet.items() if k.startswith("env:")}


def load(fleet: dict[str, str], *args: str, timeout: float = 120
         ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "batchq", "bench", "load", APP, *args],
                          cwd=REPO, env=_env_of(fleet), capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL)


def _report(proc: subprocess.CompletedProcess[str]) -> dict[str, object]:
    assert proc.stdout, proc.stderr
    report: dict[str, object] = json.loads(proc.stdout)
    return report


def _ordered(h: object) -> bool:
    assert isinstance(h, dict) and list(h) == PCT_KEYS, h
    values = [h[k] for k in PCT_KEYS]
    return values == sorted(values)


def test_target_latency_percentiles_json_and_html(fleet: dict[str, str],
                                                 tmp_path: Path) -> None:
    out = tmp_path / "report.html"
    proc = load(fleet, "hit", "--rate", "200", "--duration", "2", "--args",
                json.dumps([fleet["fast"]]), "--json", "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    r = _report(proc)
    assert set(r) == JSON_KEYS
    assert r["sent"] == 400 and r["errors"] == 0 and r["errors_by_type"] == {}
    assert r["offered_rate"] == 200
    assert 100 < r["achieved_rate"] < 300  # type: ignore[operator]
    run, start, done = r["run_ms"], r["start_ms"], r["done_ms"]
    assert _ordered(run) and _ordered(start) and _ordered(done)
    # the target holds every request 20 ms: the handler saw at least that, not much more
    assert 19.5 <= run["p50"] < 60, run  # type: ignore[index]
    assert done["p50"] >= run["p50"]  # type: ignore[index]
    timeline = r["timeline"]
    assert isinstance(timeline, list)
    assert [set(row) for row in timeline] == [{"t", "sent", "done", "errors", "p99_run_ms"}] \
        * len(timeline)
    assert sum(row["sent"] for row in timeline) == 400
    assert sum(row["done"] for row in timeline) == 400
    page = out.read_text()
    assert page.count("<svg") == 2 and "<script" not in page and "src=" not in page


def test_errors_by_type_from_exceptions_and_recorded_statuses(fleet: dict[str, str]) -> None:
    proc = load(fleet, "hit", "--rate", "100", "--duration", "1", "--args",
                json.dumps([fleet["fast"] + "/status/503"]), "--json")
    assert proc.returncode == 0, proc.stderr
    r = _report(proc)
    assert r["errors"] == 100
    assert r["errors_by_type"] == {"503": {"count": 100,
                                           "example": f"GET {fleet['fast']}/status/503: 503"}}
    # a raising handler: the exception's type, counted, not retried or dead-lettered
    proc = load(fleet, "flaky", "--rate", "200", "--duration", "1", "--args", "[1]", "--json")
    r = _report(proc)
    assert r["sent"] == 200 and r["errors"] == 200, proc.stderr
    e = r["errors_by_type"]["ValueError"]  # type: ignore[index]
    assert e["count"] == 200 and "failed on purpose" in e["example"]
    client = redis.Redis.from_url(fleet["redis_url"])
    assert client.zcard(f"{fleet['ns']}:{{{fleet['ns']}:loadtest}}:dead") == 0


def test_abort_on_error_rate_stops_the_run(fleet: dict[str, str]) -> None:
    proc = load(fleet, "hit", "--rate", "100", "--duration", "60", "--args",
                json.dumps([fleet["fast"] + "/status/429"]), "--abort-on", "errors>50%",
                "--json")
    assert proc.returncode == 1, proc.stderr
    r = _report(proc)
    assert 0 < r["sent"] < 3000  # type: ignore[operator]  # far from the 6,000 scheduled
    assert "aborted: errors>50%" in proc.stderr


def test_steps_until_p99_passes_the_knee_with_png(fleet: dict[str, str],
                                                  tmp_path: Path) -> None:
    out = tmp_path / "knee.png"
    proc = load(fleet, "hit", "--steps", "40,400", "--step-s", "3", "--args",
                json.dumps([fleet["slow"]]), "--abort-on", "p99>200ms", "--out", str(out))
    assert proc.returncode == 1, proc.stderr
    assert "status | aborted: p99>200ms" in proc.stdout
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_two_producer_processes_share_one_run(fleet: dict[str, str]) -> None:
    run_id = f"two-{uuid.uuid4().hex[:6]}"
    proc = load(fleet, "sleep_ms", "--rate", "300", "--duration", "2", "--args", "[1]",
                "--producers", "2", "--run-id", run_id, "--json")
    assert proc.returncode == 0, proc.stderr
    r = _report(proc)
    assert r["sent"] == 600 and r["offered_rate"] == 300
    meta = redis.Redis.from_url(fleet["redis_url"]).hgetall(
        load_keys(fleet["ns"], run_id).meta)
    assert meta[b"producers"] == b"2" and meta[b"finished"] == b"2"


def test_join_adds_another_machines_sends(fleet: dict[str, str]) -> None:
    run_id = f"join-{uuid.uuid4().hex[:6]}"
    first = subprocess.Popen(
        [sys.executable, "-m", "batchq", "bench", "load", APP, "sleep_ms", "--rate", "100",
         "--duration", "4", "--args", "[1]", "--run-id", run_id, "--json"],
        cwd=REPO, env=_env_of(fleet), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, stdin=subprocess.DEVNULL)
    client = redis.Redis.from_url(fleet["redis_url"])
    deadline = time.monotonic() + 30
    while not client.exists(load_keys(fleet["ns"], run_id).meta):
        assert time.monotonic() < deadline and first.poll() is None
        time.sleep(0.05)
    joined = load(fleet, "sleep_ms", "--join", run_id, "--rate", "100", "--duration", "1",
                  "--json")
    out, err = first.communicate(timeout=120)
    assert first.returncode == 0 and joined.returncode == 0, (err, joined.stderr)
    for text in (out, joined.stdout):
        r = json.loads(text)
        assert r["sent"] == 500 and r["offered_rate"] == 200
    bad = load(fleet, "sleep_ms", "--join", "no-such-run")
    assert bad.returncode == 2 and "no load run 'no-such-run'" in bad.stderr


@pytest.mark.parametrize("flags, message", [
    (["--rate", "10"], "--rate needs --duration"),
    (["--steps", "1,x", "--step-s", "1"], "'x' is not a number"),
    (["--steps", "10", "--duration", "3"], "--steps takes --step-s"),
    (["--ramp", "5", "--duration", "3"], "is not START:END"),
    (["--rate", "10", "--duration", "1", "--abort-on", "p99>fast"], "--abort-on 'p99>fast'"),
    (["--rate", "10", "--duration", "1", "--abort-on", "errors>5ms"], "a count or a percent"),
    (["--rate", "10", "--duration", "1", "--out", "x.pdf"], "ends in .html or .png"),
    (["--rate", "10", "--ramp", "0:5", "--duration", "1"], "give one of"),
    (["--rate", "10", "--duration", "1", "--producers", "0"], "must be 1..64"),
    ([], "give a rate profile"),
])
def test_bad_flags_exit_2_with_a_message(fleet: dict[str, str], flags: list[str],
                                         message: str) -> None:
    proc = load(fleet, "sleep_ms", *flags)
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr and "Traceback" not in proc.stderr


def test_a_poisoned_load_marker_runs_the_job_plainly(fleet: dict[str, str]) -> None:
    """A job whose marker is not [run id, µs] (or names an impossible run) is run as a
    plain job: the handler never sees the marker, nothing is recorded."""
    sys.path.insert(0, str(REPO))
    os.environ["LOADTEST_NS"] = fleet["ns"]
    try:
        import batchq
        from bench.loadtest.app import app
    finally:
        sys.path.remove(str(REPO))
    app.redis_settings = batchq.App(fleet["redis_url"]).redis_settings
    q = app.queue("loadtest")
    client = redis.Redis.from_url(fleet["redis_url"])
    stats = f"{fleet['ns']}:{{{fleet['ns']}:loadtest}}:stats"
    before = int(client.hget(stats, "succeeded") or 0)
    for marker in ("junk", ["bad id{}", 5], ["x", "not µs"], [1, 2, 3]):
        app.tasks["sleep_ms"].enqueue(ms=1, __batchq_load__=marker)
    deadline = time.monotonic() + 30
    while q.stats().pending:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert q.stats().dead == 0
    assert int(client.hget(stats, "succeeded") or 0) - before == 4
    app.close()
