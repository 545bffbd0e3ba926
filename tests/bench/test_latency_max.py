"""``python -m bench latency``'s maximum rate: the highest rate the fleet sustains with
the producer beside it (``--max-from sustained``, the default), found by bisection.
The search is checked against a known capacity, then run for real at tiny sizes
(nothing about speed is asserted: only that every probe is recorded, the levels are
shares of the rate found, and each figure is in order)."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest

from bench.__main__ import main
from bench.scenarios.latency import PROBE_FLOOR, PROBE_STEPS, sustained, sustained_max

pytestmark = pytest.mark.e2e


def test_bisection_lands_within_its_resolution_below_the_capacity() -> None:
    capacity = 187_000.0
    rates: list[float] = []

    def measure(rate: float) -> bool:
        rates.append(rate)
        return rate <= capacity

    found, probes = sustained_max(measure, 250_000.0)
    assert rates[0] == 250_000.0 and len(rates) == 1 + PROBE_STEPS
    assert probes == [(r, r <= capacity) for r in rates]
    assert found <= capacity  # never a rate that was not sustained
    assert capacity - found <= (1 - PROBE_FLOOR) * 250_000.0 / 2**PROBE_STEPS
    assert (found, True) in probes  # the answer was itself probed and sustained


def test_a_sustained_drain_maximum_is_the_answer() -> None:
    found, probes = sustained_max(lambda rate: True, 1000.0)
    assert (found, probes) == (1000.0, [(1000.0, True)])


def test_a_floor_not_sustained_is_halved_until_one_is() -> None:
    found, probes = sustained_max(lambda rate: rate <= 100.0, 1000.0)
    # every bisection step fails; the floor (300) fails, 150 fails, 75 holds
    assert found == 75.0
    assert [r for r, ok in probes if ok] == [75.0]
    assert probes[-3:] == [(300.0, False), (150.0, False), (75.0, True)]


def test_sustained_needs_every_job_and_the_rate() -> None:
    good = {"lost": 0, "send_errors": 0, "completion_rate": 960.0,
            "achieved_send_rate": 999.0}
    assert sustained(good, 1000.0)
    assert not sustained({**good, "lost": 1}, 1000.0)
    assert not sustained({**good, "send_errors": 1}, 1000.0)
    assert not sustained({**good, "completion_rate": 940.0}, 1000.0)
    assert not sustained({**good, "achieved_send_rate": 900.0}, 1000.0)


def test_latency_finds_its_maximum_for_real(redis_url: str, tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["latency", "--quick", "--repeat", "1", "--redis-url", redis_url,
                 "--namespace", f"bench{uuid.uuid4().hex[:8]}", "--out-dir", str(tmp_path),
                 "-p", "1", "--jobs", "2000", "--duration", "0.3", "--levels", "50"])
    out = capsys.readouterr().out
    assert code == 0, out
    rec = json.loads(next(tmp_path.glob("latency-*.json")).read_text())
    params = rec["parameters"]
    assert params["max_from"] == "sustained"
    probes = params["sustained_probes"]
    drain_max = params["drain_max_rate"]
    assert drain_max > 0 and probes[0]["offered_rate"] == drain_max
    assert len(probes) >= 1 + (0 if probes[0]["sustained"] else PROBE_STEPS)
    found = params["max_rate"]
    assert PROBE_FLOOR * drain_max / 2**PROBE_STEPS <= found <= drain_max
    # the rate found was probed and sustained, or is the untested floor after misses
    assert any(p["offered_rate"] == found and p["sustained"] for p in probes) or (
        not any(p["sustained"] for p in probes))
    for p in probes:
        assert p["sustained"] == (p["lost"] == 0 and p["completion_rate"] >= 0.95
                                  * p["offered_rate"] and p["achieved_send_rate"] >= 0.95
                                  * p["offered_rate"]), p
    level = rec["rows"][1]
    assert level["params"]["offered_rate"] == pytest.approx(found / 2)
    for name in ("sent-to-start p50", "sent-to-start p99"):
        assert level["figures"][name]["median"] >= 0
    assert (level["figures"]["sent-to-start p50"]["median"]
            <= level["figures"]["sent-to-start p99"]["median"])
    assert "highest rate sustained" in out
