"""``python -m bench.tools.events`` at a small scale, end to end (a real worker): both cases
run, the on/off ratio and the memory per retained event are reported. No time threshold
is asserted: these runs are far too small to measure anything."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest

from bench.tools.events import main

pytestmark = pytest.mark.e2e


def test_events_bench_small(redis_url: str, tmp_path: Path,
                            capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["--jobs", "500", "--repeat", "1", "--redis-url", redis_url,
                 "--namespace", f"bench{uuid.uuid4().hex[:8]}", "--out-dir", str(tmp_path),
                 "-c", "20"])
    text = capsys.readouterr().out
    assert code == 0, text
    (path,) = tmp_path.glob("events-*.json")
    rows = {r["name"]: r["figures"] for r in json.loads(path.read_text())["rows"]}
    for case in ("events off", "events on"):
        (rate,) = rows[f"drain, {case}"]["jobs/s"]["values"]
        assert rate > 0, case
    assert rows["events on / events off (same run)"]["ratio"]["median"] > 0
    mem = rows["Redis memory per retained event"]
    assert mem["events kept"]["median"] == 1000  # started + succeeded of each job
    assert 0 < mem["bytes/event"]["median"] < 1000
