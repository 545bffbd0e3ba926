"""The benchmark harness end to end with tiny inputs: every scenario runs, writes its
JSON record and prints its table, and the figures are sane. No time threshold is ever
asserted: these runs are far too small to measure anything."""

from __future__ import annotations

import ast
import json
import os
import uuid
from pathlib import Path
from typing import Any

import pytest

from bench.__main__ import main
from bench.peers import PEERS, VENV_ROOT, install_argv

pytestmark = pytest.mark.e2e

CASES = [
    ("enqueue", ["--jobs", "2000", "--producers", "4"]),
    ("drain", ["--jobs", "2000"]),
    ("allin", ["--jobs", "2000"]),
    # a fixed 100 % rate keeps the levels small; the probe is drain_once, tested above
    ("latency", ["--max-rate", "4000", "--duration", "0.3", "--levels", "25,75"]),
    ("memory", ["--jobs", "2000"]),
    ("idle", ["--duration", "0.5", "--warmup", "0.3"]),
    ("scale", ["--jobs", "1000", "--payloads", "100,10000"]),
    ("iocurve", ["--levels", "20,100", "--sleep-ms", "20"]),
]
PERCENTILES = ("p50", "p90", "p99", "p99.9", "max")
MAY_BE_ZERO = {"fleet CPU", "Redis commands/s", "server CPU", "send lateness p99",
               # CPU ticks of 10 ms sampled every 50 ms: a tiny drain may see none
               "worker CPU µs/job", "worker CPU", "Valkey CPU"}
# INFO used_memory is server-wide: on a server shared with other clients the part of a
# delta above the entry size is only a number, not necessarily positive
UNSIGNED = {"overhead/job"}
_CPUS = os.cpu_count() or 1
RSS_COUNTER_SLACK = 3 * max(32, 2 * _CPUS) * _CPUS * os.sysconf("SC_PAGE_SIZE")
"""How far two reads of a process's RSS counters may disagree: a per-CPU batch of at
most max(32, 2 x CPUs) pages per CPU, for each of the three RSS counters (file, anon,
shmem): 768 KiB on 2 CPUs."""


def _check_common(rec: dict[str, Any], scenario: str) -> None:
    assert rec["scenario"] == scenario
    assert rec["parameters"]["repeat"] == 1
    m = rec["machine"]
    assert m["cpu_count"] >= 1 and m["memory_bytes"] > 0 and m["kernel"] and m["cpu_model"]
    v = rec["versions"]
    for key in ("python", "batchq", "redis-py", "server"):
        assert v[key], key
    assert rec["rows"], "no figures"
    for row in rec["rows"]:
        for name, fig in row["figures"].items():
            assert fig["min"] <= fig["median"] <= fig["max"], (row["name"], name)
            assert len(fig["values"]) == 1
            if name in UNSIGNED:
                continue
            if name in MAY_BE_ZERO:
                assert fig["median"] >= 0, (row["name"], name)
            else:
                assert fig["median"] > 0, (row["name"], name)


@pytest.mark.parametrize(("scenario", "extra"), CASES, ids=[c[0] for c in CASES])
def test_scenario_quick(scenario: str, extra: list[str], redis_url: str, tmp_path: Path,
                        capsys: pytest.CaptureFixture[str]) -> None:
    code = main([scenario, "--quick", "--repeat", "1", "--redis-url", redis_url,
                 "--namespace", f"bench{uuid.uuid4().hex[:8]}", "--out-dir", str(tmp_path),
                 *extra])
    out = capsys.readouterr().out
    assert code == 0, out
    files = list(tmp_path.glob(f"{scenario}-*.json"))
    assert len(files) == 1
    rec = json.loads(files[0].read_text())
    _check_common(rec, scenario)
    assert f"### {scenario}" in out and "| case |" in out and str(files[0]) in out

    if scenario == "latency":
        assert rec["parameters"]["max_rate"] > 0
        assert len(rec["rows"]) == 3  # idle + two levels
        for row in rec["rows"]:
            for kind in ("start", "done"):
                vals = [row["figures"][f"{kind} {p}"]["median"] for p in PERCENTILES]
                assert vals == sorted(vals), (row["name"], kind, vals)
        for run in rec["runs"]:
            assert run["jobs"] == run["sent"] - run["lost"] and run["lost"] == 0
            assert run["enqueue_to_start"]["p50"] <= run["enqueue_to_done"]["max"]
    if scenario == "drain":
        assert {r["params"]["task"] for r in rec["rows"]} == {"noop", "batch_noop"}
        assert all(run["jobs"] == 2000 for run in rec["runs"])
    if scenario == "allin":
        assert [r["jobs"] for r in rec["runs"]] == [0, 2000, 2000, 2000]
        for run in rec["runs"][1:]:
            # start to exit contains first entry to last exit
            assert run["all_in_jobs_per_s"] <= run["jobs_per_s"] * 1.01, run
            assert run["worker_cpu_s"] > 0
    if scenario == "memory":
        run = rec["runs"][0]
        assert run["bytes_per_job"] > 0 and run["entry_bytes"] > 100
        assert run["worker_peak_rss_bytes"] > 1 << 20
    if scenario == "idle":
        run = rec["runs"][0]
        assert run["processes"] >= 2  # the supervisor and its workers
    if scenario == "scale":
        sizes = [r["params"]["payload_bytes"] for r in rec["rows"]]
        assert sizes[-2:] == [100, 10000]
    if scenario == "iocurve":
        # --quick: max(5 x C, 200) jobs per level, one worker process each
        assert [(r["concurrency"], r["jobs"]) for r in rec["runs"]] == [(20, 200), (100, 500)]
        for run in rec["runs"]:
            assert run["ideal_jobs_per_s"] == run["concurrency"] / 0.02
            # not a timing threshold: at most C handlers at once, each awaiting >= 20 ms,
            # so the drain cannot beat C / 20 ms (the slack is clock granularity)
            assert 0 < run["ratio_of_ideal"] <= 1.05, run
            assert run["fleet_exited_by_itself"] and run["worker_cpu_s"] > 0
            assert run["sampled_peak_rss_bytes"] > 1 << 20
            # VmHWM and statm's RSS are read from the kernel's per-CPU batched counters
            # (percpu_counter since Linux 6.2), each off by up to a batch of pages per CPU,
            # so a sample may read a few pages above the high-water mark (CI saw 7 pages)
            assert run["peak_rss_bytes"] >= run["sampled_peak_rss_bytes"] - RSS_COUNTER_SLACK


def test_plot(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    rec = {"scenario": "peers", "timestamp": "t", "machine": {"cpu_count": 2},
           "results": {name: {"latency": [{"offered_rate": 200.0, "sustained": True,
                                           "enqueue_to_start": {"p50": 1.0 + i, "p99": 2.0 + i,
                                                                "max": 3.0 + i}}]}
                       for i, name in enumerate(("batchq", "celery"))}}
    path = tmp_path / "peers.json"
    path.write_text(json.dumps(rec))
    out = tmp_path / "latency.png"
    assert main(["plot", str(path), "-o", str(out)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_peer_commands() -> None:
    """How each peer is installed and started, without installing or running it."""
    url = "redis://127.0.0.1:6399/3"
    assert set(PEERS) == {"celery", "rq", "arq", "dramatiq", "saq", "taskiq", "huey"}
    for name, peer in PEERS.items():
        assert peer.venv == VENV_ROOT / name
        argv = peer.worker_argv(2, url)
        assert Path(argv[0]).parent == peer.venv / "bin", argv
        assert "2" in argv, argv  # processes = the given core count
        assert any(peer.module in a or name == "rq" for a in argv), argv
        steps = install_argv(peer)
        assert steps[0][-1] == str(peer.venv) and steps[0][1:3] == ["-m", "venv"]
        assert steps[-1][-len(peer.packages) - 2 : -2] == list(peer.packages)
        assert peer.driver_argv("load", "200", "10")[:4] == [
            str(peer.python), "-m", "bench.peers.driver", name]
        # the app module each driver imports defines what the driver calls
        source = (Path(__file__).resolve().parents[2] / "bench" / "peers"
                  / f"{name}_app.py").read_text()
        defined = {n.name for n in ast.parse(source).body
                   if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)}
        assert {"enqueue_noop", "enqueue_lat", "run_load", "noop", "lat"} <= defined, name
    assert "-u" in PEERS["rq"].worker_argv(2, url) and url in PEERS["rq"].worker_argv(2, url)
    assert PEERS["arq"].worker_argv(2, url)[2:5] == ["bench.peers.multi", "2", "--"]
