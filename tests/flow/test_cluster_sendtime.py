"""Calendar quotas and send windows on a 3-master Redis Cluster: a daily quota that
resets at a pinned period end and a quiet-hours group that starts at its opening, on
queues held by two different nodes, served by one supervisor with two workers. The
boundary lists and counts stay in each queue's slot."""

from __future__ import annotations

from pathlib import Path

import pytest
from fixtures.cluster import *  # noqa: F403
from fixtures.cluster import WorkerFactory, queues_on_nodes, read_runs
from helpers import wait_until

import batchq
from batchq.dev.cluster import EmbeddedCluster
from batchq.flow import calendars, windows

pytestmark = [pytest.mark.integration, pytest.mark.cluster]


@pytest.mark.timeout(120)
def test_quota_and_window_on_two_nodes(cluster: EmbeddedCluster, app: batchq.App,
                                       start_worker: WorkerFactory, log_path: Path) -> None:
    qa, qb, _ = queues_on_nodes(cluster, app.namespace, prefix="st")
    r = app.clients.redis
    rec = app.tasks["rec"]
    app.queue(qa).limit(group="acme", max_per_day=5, tz="America/New_York")
    reset_ms = windows.server_ms(r) + 6000
    windows.pin_list(r, app.keys(qa), "@d:America/New_York",
                     [reset_ms, reset_ms + 400 * calendars.DAY_MS], calendars.DAY_MS)
    rec.options(queue=qa, group="acme").enqueue_many([f"a{i}" for i in range(8)])
    w = app.queue(qb).window(group="quiet", hours="09:00-17:00", tz="Asia/Tokyo")
    open_ms = windows.server_ms(r) + 4000
    windows.pin_list(r, app.keys(qb), w.list_field(),
                     [open_ms, open_ms + 600_000, open_ms + calendars.WEEK_MS,
                      open_ms + calendars.WEEK_MS + 600_000], calendars.WEEK_MS)
    rec.options(queue=qb, group="quiet").enqueue_many([f"q{i}" for i in range(4)])
    rec.options(queue=qb, group="loud").enqueue_many([f"l{i}" for i in range(4)])
    start_worker([qa, qb], "-p", "2", "-c", "10", serving=2)

    def starts(prefix: str) -> list[float]:
        return sorted(t for k, tok, _, t in read_runs(log_path) if tok.startswith(prefix))

    wait_until(lambda: len(starts("a")) == 8 and len(starts("q")) == 4, timeout_s=40,
               interval_s=0.1, message="the quota's jobs and the quiet group ran")
    acme = starts("a")
    assert sum(t * 1000 < reset_ms - 50 for t in acme) == 5  # 5 before the day ended
    assert acme[5] * 1000 >= reset_ms - 50
    assert starts("q")[0] * 1000 >= open_ms - 50
    assert starts("l")[-1] * 1000 < open_ms
    use = app.queue(qa).limits()
    assert use[0].max_per_day == 5 and use[0].tz == "America/New_York"
