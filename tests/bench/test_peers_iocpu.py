"""``python -m bench.peers.iocpu`` at a tiny size: each kind's burst workers drain their
io jobs and a row per kind is printed (no figure is asserted)."""

from __future__ import annotations

import pytest

from bench.peers import iocpu

pytestmark = pytest.mark.e2e


def test_iocpu_prints_a_row_per_kind(redis_url: str, capsys: pytest.CaptureFixture[str]
                                     ) -> None:
    assert iocpu.main(["--kinds", "shared,batchq", "--jobs", "50", "--repeat", "1",
                       "--redis-url", redis_url]) == 0
    out = capsys.readouterr().out
    assert "| shared |" in out and "| batchq |" in out
    assert iocpu.main(["--kinds", "nope"]) == 2
