"""The hand-off on a 3-master Redis Cluster: one worker blocked on three queues held by
three different nodes (one BLPOP per wake list) is handed each job by the enqueue that
writes it; every script keeps to its queue's slot."""

from __future__ import annotations

from pathlib import Path

import pytest
from fixtures.cluster import *  # noqa: F403
from fixtures.cluster import WorkerFactory, queues_on_nodes, read_runs
from helpers import wait_until

import batchq
from batchq.dev.cluster import EmbeddedCluster

pytestmark = [pytest.mark.integration, pytest.mark.cluster]


@pytest.mark.timeout(120)
def test_handoff_on_three_nodes(cluster: EmbeddedCluster, app: batchq.App,
                                start_worker: WorkerFactory, log_path: Path) -> None:
    queues = queues_on_nodes(cluster, app.namespace, prefix="hq")
    r = app.clients.redis
    start_worker(list(queues), "-c", "4")
    keys = [app.keys(q) for q in queues]
    wait_until(lambda: all(r.zcard(k.idle) == 1 for k in keys), timeout_s=20,
               message="the worker registered idle on every queue")
    rec = app.tasks["rec"]
    sent: list[str] = []
    for i in range(6):
        q, k = queues[i % 3], keys[i % 3]
        token = f"h{i}"
        rec.options(queue=q).enqueue(token)
        sent.append(token)
        # the next job once this one ran and the worker is blocked on every queue again
        wait_until(lambda token=token: token in {t for kind, t, _, _ in read_runs(log_path)
                                                 if kind == "rec"}
                   and all(r.zcard(kk.idle) == 1 for kk in keys),
                   timeout_s=20, interval_s=0.05, message=f"{token} ran")
    handed = [int(r.hget(k.stats, "handed") or 0) for k in keys]
    assert handed == [2, 2, 2], handed
    runs = [t for kind, t, _, _ in read_runs(log_path) if kind == "rec"]
    assert sorted(runs) == sorted(sent)  # once each
    for k in keys:
        assert r.zcard(k.reserved) == 0 and r.hlen(k.inflight) == 0
