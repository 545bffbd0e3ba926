"""Issue 11's benchmark scenarios at a small scale, end to end (real workers, the real
mock provider over loopback): correctness only — every message accepted exactly once,
every group finished, starts in any 1 s window within rate + burst. No time threshold
is asserted: these runs are far too small to measure anything."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest

from bench.__main__ import main
from bench.scenarios.flow import max_window

pytestmark = pytest.mark.e2e


def _run(scenario: str, extra: list[str], redis_url: str, out: Path,
         capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    code = main([scenario, "--repeat", "1", "--redis-url", redis_url,
                 "--namespace", f"bench{uuid.uuid4().hex[:8]}", "--out-dir", str(out),
                 *extra])
    text = capsys.readouterr().out
    assert code == 0, text
    (path,) = out.glob(f"{scenario}-*.json")
    assert f"### {scenario}" in text and str(path) in text
    rec: dict[str, Any] = json.loads(path.read_text())
    return rec


def test_max_window() -> None:
    assert max_window([]) == 0
    assert max_window([0.0, 0.5, 0.999, 1.0, 1.5]) == 3
    assert max_window([i * 0.125 for i in range(30)]) == 8


def test_fanout_small(redis_url: str, tmp_path: Path,
                      capsys: pytest.CaptureFixture[str]) -> None:
    rec = _run("fanout", ["--jobs", "1200", "--groups", "4", "--rate-sum", "400",
                          "-p", "1", "-c", "50"], redis_url, tmp_path, capsys)
    (run,) = rec["runs"]
    assert run["distinct"] == 1200 and run["lost"] == 0
    assert run["doubles"] == 0 and run["double_ids"] == []
    assert run["dead"] == 0
    assert run["groups_finished"] == 4
    assert sorted(run["per_group_accepted"].values()) == [300] * 4
    # every request was answered once: accepted or 429 (each 429 came back and was sent)
    assert run["requests"] == run["accepted"] + run["limited"]
    assert run["achieved_per_s"] > 0 and 0 <= run["finish_spread"] < 1


def test_ratecheck_small(redis_url: str, tmp_path: Path,
                         capsys: pytest.CaptureFixture[str]) -> None:
    rec = _run("ratecheck", ["--duration", "2", "--rate", "200", "--burst", "20",
                             "--group-rate", "40", "--group-burst", "4", "-p", "1",
                             "-c", "20"], redis_url, tmp_path, capsys)
    (run,) = rec["runs"]
    assert run["supervisors"] == 2
    assert run["lost"] == 0 and run["doubles"] == 0 and run["started"] == run["jobs"]
    assert run["groups_finished"] == 5  # the limited group, 3 free groups, plain jobs
    assert 0 < run["max_window"] <= run["bound"] == 220
    assert 0 < run["group_max_window"] <= run["group_bound"] == 44
