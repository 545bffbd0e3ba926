"""Fault 6: worker (and producer) clocks skewed by an hour.

A ``sitecustomize.py`` on ``PYTHONPATH`` (in a temporary directory) shifts ``time.time``,
``time.time_ns``, ``time.monotonic`` and ``time.monotonic_ns`` by ``$FAULT_CLOCK_SKEW``
seconds in every process started with it. Deadlines and due times come from the
server's ``TIME``, so a skewed worker must neither hand out a job again before its lease
ran out (a 2 s lease, a 1.5 s run) nor start a delayed job (delay 1 s) before it is due
by the server's clock. The handlers record true times (``CLOCK_REALTIME``, not through
``time.time``), comparable with the server's ``TIME`` on this host.

Single-process workers: a supervisor compares ``time.time()`` with heartbeat file mtimes
(kernel time), a mismatch a faked ``time.time`` creates but a real skewed host does not.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
from apps import fault_app
from fixtures.faults import *  # noqa: F403
from fixtures.fleet import Fleet
from helpers import REPO_ROOT, cli_env

pytestmark = pytest.mark.fault

SITECUSTOMIZE = '''
import os as _os
import time as _time

_skew = float(_os.environ.get("FAULT_CLOCK_SKEW") or 0)
if _skew:
    _t, _tns, _m, _mns = _time.time, _time.time_ns, _time.monotonic, _time.monotonic_ns
    _time.time = lambda: _t() + _skew
    _time.time_ns = lambda: _tns() + int(_skew * 1e9)
    _time.monotonic = lambda: _m() + _skew
    _time.monotonic_ns = lambda: _mns() + int(_skew * 1e9)
'''

PRODUCER = '''
import sys
from apps.fault_app import build
app = build(sys.argv[1], sys.argv[2])
app.tasks["work"].options(delay_s=1.0).enqueue_many([(t,) for t in sys.argv[3:]])
'''


@pytest.fixture
def skew_dir(tmp_path: Path) -> Path:
    d = tmp_path / "skew"
    d.mkdir()
    (d / "sitecustomize.py").write_text(SITECUSTOMIZE)
    return d


def _delayed_due(fleet: Fleet) -> dict[str, tuple[float, float]]:
    """token -> (due time by the server's clock, the producer's own estimate of it in
    the job body), in seconds, of every job in the delayed set."""
    from batchq.store import codec

    out = {}
    for entry, score in fleet.r.zrange(fleet.app.keys("default").delayed, 0, -1,
                                       withscores=True):
        job = codec.decode_entry(entry, "default")
        out[str(job.args[0])] = (score / 1000, job.ready_ms / 1000)
    return out


@pytest.mark.parametrize("skew_s", [3600.0, -3600.0], ids=["ahead", "behind"])
def test_skewed_clocks_neither_redeliver_early_nor_run_delayed_jobs_early(
        fleet: Fleet, skew_dir: Path, skew_s: float) -> None:
    env = {"PYTHONPATH": str(skew_dir), "FAULT_CLOCK_SKEW": str(skew_s)}
    w = fleet.start("-c", "30", "--lease-s", "2", env=env)
    # the worker's clock really is off: it publishes its heartbeat with time.time()
    info_key = f"{fleet.ns}:worker:*"
    key = fleet.until(lambda: next(iter(fleet.r.scan_iter(match=info_key)), None), 10,
                      "worker registered")
    seen = float(fleet.r.hget(key, "heartbeat_at"))
    assert abs(seen - fault_app.now() - skew_s) < 60, (seen, skew_s)

    work = fleet.app.tasks["work"]
    long = [f"L{i}" for i in range(8)]
    work.enqueue_many([(t, 1.5) for t in long])
    # delayed jobs from this (true) clock and from a producer skewed the other way
    delayed = [f"D{i}" for i in range(10)]
    work.options(delay_s=1.0).enqueue_many([(t,) for t in delayed])
    skewed = [f"X{i}" for i in range(10)]
    subprocess.run([sys.executable, "-c", PRODUCER, fleet.url, fleet.ns, *skewed],
                   cwd=REPO_ROOT, check=True, timeout=30,
                   env=cli_env({**env, "FAULT_CLOCK_SKEW": str(-skew_s)}))
    dues = _delayed_due(fleet)
    assert set(dues) == set(delayed + skewed), "a delayed job left the delayed set at once"
    # the skewed producer's clock really is off: its own guess of the due time is
    for t in skewed:
        assert abs(dues[t][1] - dues[t][0] + skew_s) < 60, (dues[t], skew_s)
    due = {t: server for t, (server, _) in dues.items()}
    # pops keep coming while the long jobs run: short jobs every 50 ms for 2 s
    short = []
    for i in range(40):
        short.append(f"S{i}")
        work.enqueue(short[-1])
        time.sleep(0.05)

    everything = long + delayed + skewed + short
    fleet.wait_completed(everything, 15)
    fleet.settle()
    runs = fleet.runs()
    late = []
    for r in runs:
        if r.token in due:
            early = due[r.token] - r.start
            assert early <= 0.002, f"{r.token} started {early:.3f}s before it was due"
            late.append(r.start - due[r.token])
    starts = {t: [r.attempt for r in runs if r.token == t] for t in long}
    assert all(a == [1] for a in starts.values()), f"a job was handed out again: {starts}"
    assert max(late) < 1.0, f"delayed jobs started up to {max(late):.2f}s late"
    log = w.read_log()
    assert "expired before they could be extended" not in log, log
    report = fleet.check(everything, killed_pids=())
    print(f"\nskew {skew_s:+.0f}s: checker {report.summary()}; delayed jobs started "
          f"{min(late) * 1000:.0f}..{max(late) * 1000:.0f} ms after due")
    assert report.valid, report.details()
    assert fleet.leftovers() == []
