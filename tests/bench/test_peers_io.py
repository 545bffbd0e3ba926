"""``python -m bench peers`` with the job that does I/O (``--job io``) and the bare
``RPUSH`` -> ``BLPOP`` floor in the latency rotation. The runs are real (an embedded
Valkey, real worker fleets) at tiny sizes; nothing about speed is asserted, only that
every job ran, the client kinds each do their round trip, and the ratios are printed."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import pytest
import redis

from bench.__main__ import main
from bench.peers import iojob
from bench.peers.run import best_peer, floor_ratio

pytestmark = pytest.mark.e2e


def test_floor_ratio_and_best_peer() -> None:
    assert floor_ratio({"p50": 3.0, "p99": 8.0}, {"p50": 2.0, "p99": 4.0}) == "1.50 / 2.00"
    assert floor_ratio({"p50": 3.0, "p99": 8.0}, None) == "-"
    assert floor_ratio({"p50": 3.0, "p99": 8.0}, {"p50": 0.0, "p99": 4.0}) == "-"

    def drain(v: float) -> dict[str, object]:
        return {"drain": {"jobs_per_s": {"median": v}}}

    res = {"batchq": drain(9000.0), "batchq+batched": drain(20000.0), "huey": drain(3000.0),
           "taskiq": drain(2000.0), "floor": {"drain": None}, "rq": {"drain": None}}
    assert best_peer(res) == ("huey", 3000.0)
    assert best_peer({"batchq": drain(1.0)}) is None


@pytest.mark.parametrize("kind", iojob.KINDS)
def test_each_client_kind_does_its_round_trip(redis_url: str, kind: str,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BENCH_REDIS_URL", redis_url)
    monkeypatch.setenv(iojob.CLIENT_ENV, kind)
    monkeypatch.setenv(iojob.POOL_ENV, "4")
    client = redis.Redis.from_url(redis_url)
    key = f"bench:io:{os.getpid()}"
    client.delete(key)

    async def many() -> None:
        iojob._async.clear()
        # more jobs at once than a blocking pool of 4 has connections
        await asyncio.gather(*(iojob.around_trip() for _ in range(50)))

    asyncio.run(many())
    assert client.get(key) == b"1"
    client.delete(key)
    iojob.round_trip()
    assert client.get(key) == b"1"
    client.delete(key)
    client.close()


def test_io_drain_and_the_floor(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # its own embedded Valkey: the floor's database is flushed
    code = main(["peers", "--quick", "--peers", "", "--job", "io", "--io-client",
                 "shared,batched", "--jobs", "300", "--rates", "200", "--duration", "0.3",
                 "--batchq-api", "sync", "-p", "1", "--out-dir", str(tmp_path)])
    out = capsys.readouterr().out
    assert code == 0, out
    (path,) = tmp_path.glob("peers-*.json")
    rec = json.loads(path.read_text())
    res = rec["results"]
    assert rec["parameters"]["job"] == "io"
    for name in ("batchq-sync", "batchq+batched"):
        assert res[name]["drain"]["never_ran"] == 0, name
        assert res[name]["drain"]["jobs_per_s"]["median"] > 0, name
    # the extra client kind drains only; the floor has no drain, only latency
    assert res["batchq+batched"]["latency"] == []
    assert res["floor"]["drain"] is None
    (lv,) = res["floor"]["latency"]
    assert lv["offered_rate"] == 200 and lv["lost"] == 0
    assert 0 < lv["sent_to_start"]["p50"] <= lv["enqueue_to_start"]["p99"]
    assert "| floor | 200 | yes (1 of 1) |" in out
    floor_row = next(line for line in out.splitlines() if line.startswith("| floor | 200 |"))
    assert floor_row.rstrip().endswith("| 1.00 / 1.00 |")
    bq_row = next(line for line in out.splitlines() if line.startswith("| batchq-sync | 200 |"))
    assert bq_row.rstrip().split("|")[-2].strip().count("/") == 1  # p50 / p99 ÷ floor's


def test_startpath_prints_the_start_against_the_floor(
        redis_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    from bench.tools import startpath

    assert startpath.main(["--rates", "100", "--repeat", "1", "--duration", "1",
                           "--floor", "--redis-url", redis_url]) == 0
    out = capsys.readouterr().out
    assert "start ÷ floor's p50 / p99 |" in out
    rows = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[1:-1]]
            for line in out.splitlines() if line.startswith("| /") or
            line.startswith(f"| {startpath.FLOOR}")}
    assert rows[startpath.FLOOR][-1] == "1.00 / 1.00"
    p50, p99 = (float(x) for x in rows[str(startpath.HERE.parent)][-1].split(" / "))
    assert p50 > 0 and p99 > 0
