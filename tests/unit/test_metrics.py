"""metrics.py without Redis: every series declared at 0, and the bulk histogram add that
reaches into prometheus_client (pinned in pyproject) still equals ``observe``."""

from __future__ import annotations

import random
import subprocess
import sys
from pathlib import Path

from prometheus_client import CollectorRegistry, Histogram, generate_latest

from batchq import metrics


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
        "from batchq.metrics import Recorder\n"
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
