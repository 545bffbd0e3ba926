"""``python -m bench.tools.script_cost``: two trees' pop/ack scripts timed on one server (here
this checkout against itself, tiny sizes)."""

from __future__ import annotations

from pathlib import Path

import pytest

from batchq.store import scripts
from bench.tools import script_cost

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]


def test_script_cost_reports_both_trees(capsys: pytest.CaptureFixture[str]) -> None:
    script_cost.main([str(REPO), str(REPO), "--jobs", "300", "--rounds", "1"])
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith(f"| {REPO} |")]
    assert len(rows) == 1  # the same tree twice is one row (a dict keyed by tree)
    pop, ack, total = (float(x) for x in rows[0].split("|")[2:5])
    assert pop > 0 and ack > 0 and total == pytest.approx(pop + ack, rel=0.05)
    assert script_cost.script_source(REPO, "pop").startswith("-- _lib.lua")
    # what the tree itself sends (its library trimmed to what each script uses)
    assert script_cost.script_source(REPO, "extend") == scripts.source("extend")


def test_script_cost_times_the_hand_off(capsys: pytest.CaptureFixture[str]) -> None:
    script_cost.main([str(REPO), str(REPO), "--handoff", "--calls", "50", "--rounds", "1"])
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith(f"| {REPO} |")]
    assert len(rows) == 1
    assert "| tree | handed off | nobody registered | idle pop |" in out
    handed, nobody, idle_pop = (float(x) for x in rows[0].split("|")[2:5])
    assert handed > 0 and nobody > 0 and idle_pop > 0
