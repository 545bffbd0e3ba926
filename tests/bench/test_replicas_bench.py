"""``python -m bench.tools.replicas``: enqueue_many and drain with ``min_replicas`` 0 and 1 in
one run (tiny sizes: that it runs and reports both rows, not the figures)."""

from __future__ import annotations

import pytest

from bench.tools import replicas

pytestmark = pytest.mark.e2e


def test_replicas_bench_reports_both_settings(capsys: pytest.CaptureFixture[str]) -> None:
    replicas.main(["--jobs", "300", "--repeat", "1"])
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith("| 0 |")
            or line.startswith("| 1 |")]
    assert len(rows) == 2, out
    for row in rows:
        enq, drain = (float(c.split()[0].replace(",", "")) for c in row.split("|")[2:4])
        assert enq > 0 and drain > 0
