"""``python -m bench peers`` climbing the offered rate until a system falls behind, and
the plot that draws where it does. The runs are real (an embedded Valkey, real worker
fleets) at tiny sizes; nothing about speed is asserted, only how the climb is shaped:
rates in order, one per step, and nothing measured after the first rate a system did
not sustain."""

from __future__ import annotations

import json
import re
import uuid
from pathlib import Path
from typing import Any

import pytest

from bench.__main__ import main
from bench.peers import PEERS
from bench.peers.run import climb, rate_plan, runs_needed
from bench.tools.plot import curve, points

pytestmark = pytest.mark.e2e


def test_rate_plan_sorts_then_climbs_to_the_cap() -> None:
    assert list(rate_plan([3000, 200, 1000, 200], None, 1e9)) == [200, 1000, 3000]
    assert list(rate_plan([200, 1000, 3000], 2.0, 50_000)) == [
        200, 1000, 3000, 6000, 12_000, 24_000, 48_000]
    assert list(rate_plan([200], 2.0, 400)) == [200, 400]  # the cap itself is offered
    with pytest.raises(ValueError):
        list(rate_plan([200], 1.0, 400))


def test_climb_stops_at_the_first_rate_a_majority_of_runs_misses() -> None:
    # sustained up to 1,000; at 3,000 the first run makes it, the next two do not
    outcomes = {200: [True] * 3, 1000: [True] * 3, 3000: [True, False, False],
                6000: [True] * 3}
    calls: list[float] = []

    def measure(rate: float) -> dict[str, Any]:
        calls.append(rate)
        return {"sustained": outcomes[int(rate)][calls.count(rate) - 1]}

    levels = climb([200, 1000, 3000, 6000], 3, measure)
    assert [rate for rate, _ in levels] == [200, 1000, 3000]
    assert calls == [200] * 3 + [1000] * 3 + [3000] * 3
    # one run of three failing does not end the climb; the runs stop once two have
    calls.clear()
    outcomes = {200: [False, True, True], 1000: [False, False, True]}
    levels = climb([200, 1000], 3, measure)
    assert [(rate, len(runs)) for rate, runs in levels] == [(200, 3), (1000, 2)]
    assert runs_needed(1) == 1 and runs_needed(2) == 2 and runs_needed(3) == 2


def _check_climb(rec: dict[str, Any], system: str) -> None:
    params = rec["parameters"]
    plan = list(rate_plan(params["rates"], params["climb_factor"], params["max_rate"]))
    levels = rec["results"][system]["latency"]
    rates = [lv["offered_rate"] for lv in levels]
    assert rates == plan[: len(rates)] and rates, (system, rates)
    assert all(lv["sustained"] for lv in levels[:-1]), system
    # it stopped because the last rate was missed, or because the plan ran out
    assert not levels[-1]["sustained"] or len(rates) == len(plan), system
    for lv in levels:
        assert 1 <= lv["runs"] <= params["repeat"]
        assert lv["sustained"] == (lv["sustained_runs"] >= params["runs_needed"])
        s = lv["enqueue_to_start"]
        assert 0 < s["p50"] <= s["p99"] <= s["max"], (system, lv)


def test_batchq_climbs_until_it_falls_behind(redis_url: str, tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    # 500,000 jobs/s for 0.05 s: far more than one Python producer sends, so the climb
    # normally ends there, missed; the checks hold either way
    code = main(["peers", "--quick", "--peers", "", "--no-drain", "--rates", "200",
                 "--climb", "--climb-factor", "50", "--max-rate", "1000000",
                 "--duration", "0.05", "--redis-url", redis_url, "--allow-flush",
                 "--namespace", f"bench{uuid.uuid4().hex[:8]}", "--out-dir", str(tmp_path)])
    out = capsys.readouterr().out
    assert code == 0, out
    (path,) = tmp_path.glob("peers-*.json")
    rec = json.loads(path.read_text())
    assert rec["results"]["batchq"]["drain"] is None
    _check_climb(rec, "batchq")
    # whether 200/s is sustained depends on the machine's load (speed is the harness's
    # figure, not a test's): the row is there, with its verdict
    assert re.search(r"\| batchq \| 200 \| (yes|\*\*no\*\*) \(\d of 1\) \|", out), out
    # the same climb with enqueue from a plain thread (--batchq-api both, the default)
    assert rec["parameters"]["batchq_api"] == "both"
    assert rec["results"]["batchq-sync"]["drain"] is None
    _check_climb(rec, "batchq-sync")
    assert re.search(r"\| batchq-sync \| 200 \| (yes|\*\*no\*\*) \(\d of 1\) \|", out), out
    assert "highest rate sustained / first not" in out
    png = tmp_path / "latency.png"
    assert main(["plot", str(path), "-o", str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.skipif(not PEERS["huey"].python.exists(),
                    reason="no bench/.peers-venv/huey: python -m bench peers --setup")
def test_a_peer_climbs_too(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # its own embedded Valkey: the peers' databases are flushed
    code = main(["peers", "--quick", "--peers", "huey", "--no-batchq", "--jobs", "200",
                 "--rates", "200", "--climb", "--climb-factor", "50", "--max-rate", "10000",
                 "--duration", "0.1", "--out-dir", str(tmp_path)])
    out = capsys.readouterr().out
    assert code == 0, out
    (path,) = tmp_path.glob("peers-*.json")
    rec = json.loads(path.read_text())
    res = rec["results"]["huey"]
    assert res["drain"]["never_ran"] == 0 and res["drain"]["jobs_per_s"]["median"] > 0
    _check_climb(rec, "huey")


def test_plot_ends_a_curve_at_its_first_missed_rate(tmp_path: Path) -> None:
    def level(rate: float, ms: float, ok: bool) -> dict[str, Any]:
        return {"offered_rate": rate, "sustained": ok,
                "enqueue_to_start": {"p50": ms, "p99": 2 * ms, "max": 3 * ms}}

    rec = {"scenario": "peers", "timestamp": "t", "machine": {"cpu_count": 2},
           "results": {
               "batchq": {"latency": [level(200, 1, True), level(1000, 1, True)]},
               # a level after the miss (an older record, no climb) is not drawn
               "rq": {"latency": [level(200, 2, True), level(1000, 900, False),
                                  level(3000, 5, True)]}}}
    data = points([rec])
    assert curve(data["batchq"]) == ([200.0, 1000.0], None)
    assert curve(data["rq"]) == ([200.0], 1000.0)
    assert sorted(data["rq"]) == [200.0, 1000.0]
    path = tmp_path / "peers.json"
    path.write_text(json.dumps(rec))
    pytest.importorskip("matplotlib")
    out = tmp_path / "latency.png"
    assert main(["plot", str(path), "-o", str(out)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
