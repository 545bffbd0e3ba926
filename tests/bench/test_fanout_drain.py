"""The ``fanout-drain`` benchmark scenario at a small scale, end to end (a real
``batchq worker -p 1 --burst`` per case): every case runs, its figures and ratios are
in the record and in the printed table. No time threshold is asserted: these runs are
far too small to measure anything."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest

from bench.__main__ import main
from bench.scenarios.fanout_drain import CASES

pytestmark = pytest.mark.e2e

FIGURES = ("all-in jobs/s", "÷ plain", "worker CPU µs/job", "Redis CPU µs/job",
           "Redis µs ÷ plain's", "enqueue jobs/s", "enqueue ÷ plain")


def test_fanout_drain_quick(redis_url: str, tmp_path: Path,
                            capsys: pytest.CaptureFixture[str]) -> None:
    jobs, groups = 300, 10
    code = main(["fanout-drain", "--quick", "--jobs", str(jobs), "--groups", str(groups),
                 "--redis-url", redis_url, "--namespace", f"bench{uuid.uuid4().hex[:8]}",
                 "--out-dir", str(tmp_path)])
    text = capsys.readouterr().out
    assert code == 0, text
    (path,) = tmp_path.glob("fanout-drain-*.json")
    assert "### fanout-drain" in text and str(path) in text
    assert "÷ plain" in text and "Redis µs ÷ plain's" in text
    rec = json.loads(path.read_text())
    assert rec["parameters"]["jobs"] == jobs and rec["parameters"]["repeat"] == 1
    names = [c.name.format(groups=groups) for c in CASES]
    rows = {r["name"]: r for r in rec["rows"]}
    assert list(rows)[:len(CASES)] == names
    for name in names:
        figs = rows[name]["figures"]
        assert set(FIGURES) <= set(figs), name
        for f in FIGURES:
            (value,) = figs[f]["values"]
            assert value > 0, (name, f)
    assert rows[names[0]]["figures"]["÷ plain"]["median"] == 1.0
    assert rows[names[1]]["params"]["groups"] == groups
    # each case ran once, by a worker that drained every job (checked by the scenario)
    runs = [r for r in rec["runs"] if r["case"] != "floor"]
    assert sorted(r["case"] for r in runs) == sorted(names)
    assert all(r["jobs"] == jobs and r["wall_s"] > 0 for r in runs)
    (floor,) = [r for r in rec["runs"] if r["case"] == "floor"]
    assert floor["rpush"]["enqueue_jobs_per_s"] > 0 and floor["lpop"]["all_in_jobs_per_s"] > 0
    push, pop = (r for r in rec["rows"] if r["name"].startswith("floor: "))
    assert push["figures"]["enqueue jobs/s"]["median"] > 0
    assert pop["figures"]["all-in jobs/s"]["median"] > 0


def test_fanout_drain_before_runs_both_trees(redis_url: str, tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    """``--before DIR``: every case runs from both trees (each fill in a child process on
    its tree's own code), and this tree's rows carry their ratios to the before rows."""
    jobs, groups = 200, 5
    repo = Path(__file__).resolve().parents[2]
    code = main(["fanout-drain", "--quick", "--jobs", str(jobs), "--groups", str(groups),
                 "--before", str(repo), "--redis-url", redis_url,
                 "--namespace", f"bench{uuid.uuid4().hex[:8]}", "--out-dir", str(tmp_path)])
    text = capsys.readouterr().out
    assert code == 0, text
    (path,) = tmp_path.glob("fanout-drain-*.json")
    rec = json.loads(path.read_text())
    names = [c.name.format(groups=groups) for c in CASES]
    rows = {r["name"]: r for r in rec["rows"]}
    for name in names:
        assert rows[f"before: {name}"]["params"]["tree"] == str(repo)
        figs = rows[name]["figures"]
        for f in ("÷ before", "Redis µs ÷ before's", "enqueue ÷ before"):
            (value,) = figs[f]["values"]
            assert value > 0, (name, f)
        assert "÷ before" not in rows[f"before: {name}"]["figures"]
    runs = [r["case"] for r in rec["runs"] if r["case"] != "floor"]
    assert sorted(runs) == sorted([*names, *(f"before: {n}" for n in names)])
