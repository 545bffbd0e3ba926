"""The flow-control series on ``/metrics`` of a real ``batchq worker -p 1``: grouped jobs,
groups by state, the queue's hold, and per limited group the concurrency used, the rate
limit and the seconds left of a hold; groups without a limit of their own are never a
label value."""

from __future__ import annotations

import re
import urllib.request
from collections.abc import Callable

import pytest
from fixtures.flow import *  # noqa: F403
from helpers import CliProcess, free_port, wait_until

import batchq

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        body: bytes = resp.read()
    return body.decode()


def series(text: str, name: str, queue: str) -> dict[str, float]:
    """Metric ``name`` of ``queue``: ``{value of its other label ("" if none): value}``."""
    out = {}
    for m in re.finditer(rf"^{name}\{{(.*)\}} (\S+)$", text, re.M):
        labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1)))
        if labels.pop("queue") == queue:
            out[next(iter(labels.values()), "")] = float(m.group(2))
    return out


def test_flow_series_on_metrics(app: batchq.App, queue_name: str,
                                start_worker: Callable[..., CliProcess]) -> None:
    q = app.queue(queue_name)
    work = app.tasks["work"].options(queue=queue_name)
    q.limit(rate_per_s=500, burst=50)                    # the queue's own: group=""
    q.limit(group="*", rate_per_s=100)                   # the default: group="*"
    q.limit(group="busy", concurrency=2)                 # runs 2 long jobs: ratio 1
    q.limit(group="held", rate_per_s=5, concurrency=3)   # held 900 s: waiting
    q.hold(900, group="held")
    work.options(group="held").enqueue_many([("h1",), ("h2",)])
    work.options(group="busy").enqueue_many([(f"b{i}", 30) for i in range(4)])
    work.options(group="free").enqueue_many([(f"f{i}",) for i in range(3)])

    port = free_port()
    proc = start_worker(queue_name, "-p", "1", "-c", "4", "--metrics-port", str(port))
    Q = queue_name

    def ready() -> bool:
        try:
            text = scrape(port)
        except OSError:  # the supervisor's metrics server is not listening yet
            return False
        # busy at its limit, and the free group's jobs all ran: the grouped jobs left
        # are 2 held + 2 busy (a scrape can land between busy's second start and
        # free's last one: "*" lets free run only 100 a second)
        return (series(text, "batchq_limit_concurrency_used_ratio", Q).get("busy") == 1.0
                and series(text, "batchq_queue_grouped_jobs", Q) == {"": 4})

    wait_until(ready, timeout_s=30, interval_s=0.2,
               message=f"busy never at its limit with free's jobs run\n"
                       f"{proc.read_log()[-3000:]}")
    text = scrape(port)

    assert series(text, "batchq_queue_grouped_jobs", Q) == {"": 4}  # 2 held + 2 busy
    # held (a hold) and busy (blocked) wait; free ran its jobs
    assert series(text, "batchq_queue_groups", Q) == {"ready": 0, "waiting": 2}
    assert series(text, "batchq_queue_held_seconds", Q) == {"": 0}

    # the queue's own limit has no concurrency; "*" applies to each group on its own
    assert series(text, "batchq_limit_concurrency_used_ratio", Q) == {"busy": 1.0,
                                                                      "held": 0.0}
    assert series(text, "batchq_limit_rate_per_second", Q) == {"": 500.0, "*": 100.0,
                                                               "held": 5.0}
    waiting = series(text, "batchq_group_waiting_seconds", Q)
    assert list(waiting) == ["held"]
    assert 850 < waiting["held"] <= 900
    # a group without a limit of its own is never a label value
    assert 'group="free"' not in text
    for name in ("batchq_limit_concurrency_used_ratio", "batchq_limit_rate_per_second",
                 "batchq_group_waiting_seconds"):
        assert "(at most 50 groups per queue)" in text.split(f"# HELP {name} ", 1)[1] \
            .split("\n", 1)[0]

    # a hold of the whole queue
    q.hold(120)
    wait_until(lambda: series(scrape(port), "batchq_queue_held_seconds", Q)[""] > 100,
               timeout_s=10, interval_s=0.2, message="the queue's hold not exported")
