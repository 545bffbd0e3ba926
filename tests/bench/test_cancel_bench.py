"""The ``cancel-drop`` benchmark scenario at a small scale, end to end (a real worker):
every case runs and reports a positive rate for each repeat, and its ratios. No time
threshold is asserted: these runs are far too small to measure anything."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest

from bench.__main__ import main
from bench.scenarios.cancel import CASES

pytestmark = pytest.mark.e2e


def test_cancel_drop_small(redis_url: str, tmp_path: Path,
                           capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["cancel-drop", "--jobs", "500", "--repeat", "1", "--redis-url", redis_url,
                 "--namespace", f"bench{uuid.uuid4().hex[:8]}", "--out-dir", str(tmp_path),
                 "-c", "20"])
    text = capsys.readouterr().out
    assert code == 0, text
    (path,) = tmp_path.glob("cancel-drop-*.json")
    assert "### cancel-drop" in text and str(path) in text
    rows = {r["name"]: r["figures"] for r in json.loads(path.read_text())["rows"]}
    for case in CASES:
        (rate,) = rows[f"{case}, 1 process"]["jobs/s"]["values"]
        assert rate > 0, case
    for case in CASES[1:]:
        assert rows[f"{case} / plain drain (same run)"]["ratio"]["median"] > 0
