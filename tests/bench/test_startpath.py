"""``python -m bench.tools.startpath``: a real worker process and producer at a low rate; the
three parts of each job's start add up, and an idle worker is handed every job."""

from __future__ import annotations

import pytest

from bench.tools import startpath

pytestmark = pytest.mark.e2e


@pytest.mark.parametrize("api", ["async", "sync"])
def test_startpath_splits_the_start_of_each_job(redis_url: str, api: str,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    assert startpath.main(["--rates", "100", "--repeat", "1", "--duration", "1",
                           "--api", api, "--redis-url", redis_url]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines()
            if line.startswith("| /")]
    assert len(rows) == 1, rows
    cells = [c.strip() for c in rows[0].split("|")[1:-1]]
    assert cells[1] == "100"
    start, call, to_worker, in_worker = (float(c.split(" / ")[0]) for c in cells[2:6])
    assert 0 < in_worker < start and 0 < to_worker < start and call > 0
    assert start == pytest.approx(to_worker + in_worker, abs=0.2)
    # 100 jobs/s: the worker is blocked when each job comes, so it is handed them (a
    # stall of the box longer than the 10 ms between jobs may cost one)
    assert int(cells[6].rstrip("%")) >= 90, cells[6]
    # the server's time in batchq's scripts and BLPOP per job: an enqueue, a hand-off
    # and an ack at least, far below a millisecond
    assert 1 < float(cells[7]) < 1000, cells[7]


def test_startpath_floor_runs_beside_batchq(redis_url: str,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    """``--floor``: a bare RPUSH producer and a BLPOP worker process, in the same table;
    every job it sent was received (the split's parts are measured, not assumed)."""
    assert startpath.main(["--rates", "100", "--repeat", "1", "--duration", "1",
                           "--floor", "--redis-url", redis_url]) == 0
    out = capsys.readouterr().out
    rows = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[1:-1]]
            for line in out.splitlines() if line.startswith("| /") or
            line.startswith(f"| {startpath.FLOOR}")}
    assert set(rows) == {str(startpath.HERE.parent), startpath.FLOOR}, out
    floor = rows[startpath.FLOOR]
    start, call, to_worker, in_worker = (float(c.split(" / ")[0]) for c in floor[2:6])
    # the floor's worker takes the job as BLPOP returns: nothing between got and start
    assert in_worker == 0 and start == to_worker > 0 and call > 0
    assert floor[6] == "—"
    # one RPUSH and one BLPOP a job: a few µs of server time, not zero
    assert 0 < float(floor[7]) < 100, floor[7]
    run = startpath.one_run(redis_url, None, 100, 0.5)
    assert run["jobs"] == run["sent"] == 50 and run["in_worker_p50"] == 0


def test_startpath_refuses_bad_flags(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        startpath.main(["--rates", "fast"])
    assert exc.value.code == 2
    assert "--rates" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        startpath.main(["--trees", "/nonexistent"])
    assert exc.value.code == 2
    with pytest.raises(SystemExit) as exc:
        startpath.main(["--api", "threads"])
    assert exc.value.code == 2
