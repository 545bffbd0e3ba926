"""metrics.py without Redis: every series declared at 0, and the bulk histogram add that
reaches into prometheus_client (pinned in pyproject) still equals ``observe``."""

from __future__ import annotations

import random
import subprocess
import sys
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, Histogram, generate_latest

from batchq.ops import metrics

pytestmark = pytest.mark.unit


def test_bulk_histogram_add_equals_observe() -> None:
    reg = CollectorRegistry()
    bulk = Histogram("bulk_seconds", "h", ["q"], buckets=metrics.RUN_BUCKETS, registry=reg)
    one = Histogram("one_seconds", "h", ["q"], buckets=metrics.RUN_BUCKETS, registry=reg)
    local = metrics._Hist(metrics.RUN_BUCKETS)
    rng = random.Random(7)
    values = [rng.choice([0.0001, 0.003, 0.5, 2.0, 1000.0]) * rng.random() for _ in range(500)]
    values += list(metrics.RUN_BUCKETS)  # exactly on a bound: le is inclusive
    for v in values:
        local.observe(("a",), v)
        one.labels("a").observe(v)
    for key, counts, total in local.drain():
        metrics._add_to_histogram(bulk.labels(*key), counts, total)
    text = generate_latest(reg).decode()
    lines = {ln.replace("bulk_", "X_") for ln in text.splitlines() if ln.startswith("bulk_")}
    ones = {ln.replace("one_", "X_") for ln in text.splitlines() if ln.startswith("one_")}
    assert len(lines) > len(metrics.RUN_BUCKETS)
    # _created differs (two metrics made at two times); everything else is equal
    assert {ln for ln in lines if "_created" not in ln} == \
        {ln for ln in ones if "_created" not in ln}


def test_observe_many_equals_observe() -> None:
    rng = random.Random(11)
    cases = [
        [rng.random() * 0.0004 for _ in range(300)],  # all in the first bucket
        [rng.random() ** 4 * 100 for _ in range(300)] + list(metrics.RUN_BUCKETS),
        [-0.5, 0.0, 0.0005, 0.00051, 300.0, 301.0, 1e9],  # negatives count as 0
        [],
    ]
    for values in cases:
        one = metrics._Hist(metrics.RUN_BUCKETS)
        bulk = metrics._Hist(metrics.RUN_BUCKETS)
        for v in values:
            one.observe(("a",), max(0.0, v))
        bulk.observe_many(("a",), list(values))
        assert bulk.counts == one.counts
        for key, total in one.sums.items():
            assert abs(bulk.sums[key] - total) < 1e-6 * max(1.0, total)


def test_recorder_fold_counts_every_job() -> None:
    code = (
        "from batchq.ops.metrics import Recorder\n"
        "r = Recorder()\n"
        "s = r.series_of('q', 't')\n"
        "s.restarts += 1; s.waits += [0.1, 0.2]; s.runs += [0.0001, 0.0002, 2.0]\n"
        "r.flush({'q': 1})\n"
        "s.restarts += 1; s.runs.append(0.0003)\n"
        "r.flush({'q': 0})\n"
        "from prometheus_client import REGISTRY as R\n"
        "g = R.get_sample_value\n"
        "print(g('batchq_jobs_started_total', {'queue': 'q', 'task': 't'}),\n"
        "      g('batchq_job_wait_seconds_count', {'queue': 'q', 'task': 't'}),\n"
        "      g('batchq_job_run_seconds_count', {'queue': 'q', 'task': 't'}),\n"
        "      g('batchq_job_run_seconds_bucket', {'queue': 'q', 'task': 't', 'le': '0.0005'}))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.split()
    assert [float(x) for x in out] == [4.0, 2.0, 4.0, 3.0]


def test_fallback_without_private_buckets_keeps_counts() -> None:
    reg = CollectorRegistry()
    h = Histogram("fb_seconds", "h", buckets=(1.0, 2.0), registry=reg)

    class Shim:  # a child whose internals changed: only observe() and the bounds
        _upper_bounds = h._upper_bounds

        def observe(self, v: float) -> None:
            h.observe(v)

    metrics._add_to_histogram(Shim(), [2, 1, 3], 10.0)
    assert reg.get_sample_value("fb_seconds_count") == 6
    assert reg.get_sample_value("fb_seconds_bucket", {"le": "1.0"}) == 2
    assert reg.get_sample_value("fb_seconds_bucket", {"le": "2.0"}) == 3


def test_redelivered_and_stale_are_declared_at_zero() -> None:
    # a fresh interpreter: Recorder registers on prometheus_client's global registry
    code = (
        "from prometheus_client import generate_latest\n"
        "from batchq.ops.metrics import Recorder\n"
        "r = Recorder(); r.declare([('mail', 'send'), ('mail', 'other'), ('sms', 'x')])\n"
        "print(generate_latest().decode())\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    for q in ("mail", "sms"):
        assert f'batchq_jobs_redelivered_total{{queue="{q}"}} 0.0' in out
        assert f'batchq_stale_acks_total{{queue="{q}"}} 0.0' in out


def test_build_info_does_not_import_the_package_root() -> None:
    code = (
        "import sys\n"
        "from batchq import metrics\n"
        "fams = list(metrics.BuildInfoCollector().collect())\n"
        "print(fams[0].samples[0].labels['version'])\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.strip()
    assert out and out != "unknown"
    src = Path(metrics.__file__).read_text()
    assert "from . import __version__" not in src
