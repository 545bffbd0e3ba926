"""``python -m bench.tools.callcost``: real producer processes against a real server; every
row has its figures, and bad flags exit 2."""

from __future__ import annotations

import pytest

from bench.tools import callcost

pytestmark = pytest.mark.e2e


def test_callcost_times_both_apis(redis_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert callcost.main(["--calls", "200", "--idle-calls", "20", "--sleep-ms", "1",
                          "--rounds", "1", "--redis-url", redis_url]) == 0
    rows = [[c.strip() for c in line.split("|")[1:-1]]
            for line in capsys.readouterr().out.splitlines() if line.startswith("| /")]
    assert [r[1] for r in rows] == ["sync", "async"]
    for _, _, tight, idle, server in rows:
        # a call is a round trip: the server's time in the script is part of it
        assert 0 < float(server) < float(tight) < 100_000
        assert 0 < float(idle) < 100_000


def test_callcost_refuses_bad_flags(capsys: pytest.CaptureFixture[str]) -> None:
    for bad in (["--api", "threads"], ["--calls", "0"], ["--trees", "/nonexistent"],
                ["--rounds", "x"]):
        with pytest.raises(SystemExit) as exc:
            callcost.main(bad)
        assert exc.value.code == 2, bad
        assert "--" in capsys.readouterr().err
