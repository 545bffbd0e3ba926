"""Expiry on a 3-master Redis Cluster: jobs past their deadline on queues on every node
(plain, grouped, a campaign's, a sharded queue's) never run and are counted, while the
jobs without a deadline beside them all run."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from fixtures.cluster import *  # noqa: F403
from fixtures.cluster import WorkerFactory, queues_on_nodes, read_runs
from helpers import wait_until

import batchq
from batchq.dev.cluster import EmbeddedCluster

pytestmark = [pytest.mark.integration, pytest.mark.cluster]


@pytest.mark.timeout(120)
def test_expired_jobs_never_run_on_any_node(cluster: EmbeddedCluster, app: batchq.App,
                                            start_worker: WorkerFactory,
                                            log_path: Path) -> None:
    qa, qb, qc = queues_on_nodes(cluster, app.namespace, prefix="xq")
    qs = f"{qa}s"  # a sharded queue: its shards land on several nodes
    app.queue(qs, shards=3)
    app.queue(qb).limit(group="acme", max_pending=20)
    rec = app.tasks["rec"]
    sale = app.campaign("sale", expires_at=time.time() + 0.5)
    rec.options(queue=qa, expires_s=0.3).enqueue_many([f"xa{i}" for i in range(20)])
    rec.options(queue=qb, group="acme", expires_s=0.3).enqueue_many(
        [f"xb{i}" for i in range(20)])
    rec.options(queue=qc, campaign=sale).enqueue_many([f"xc{i}" for i in range(20)])
    sale.seal()
    rec.options(queue=qs, expires_s=0.3).enqueue_many([f"xs{i}" for i in range(30)])
    for q in (qa, qb, qc, qs):
        rec.options(queue=q).enqueue_many([f"l{q}{i}" for i in range(5)])
    time.sleep(0.7)
    start_worker([qa, qb, qc, qs], "-c", "10")

    def live() -> int:
        return sum(1 for _, tok, _, _ in read_runs(log_path) if tok.startswith("l"))

    wait_until(lambda: live() >= 20, timeout_s=30, message="the live jobs did not all run")
    wait_until(lambda: sum(app.queue(q).stats().expired for q in (qa, qb, qc, qs)) == 90,
               timeout_s=20, message="the expired jobs were not all dropped")
    assert not any(tok.startswith("x") for _, tok, _, _ in read_runs(log_path))
    wait_until(lambda: sale.stats().pending == 0, timeout_s=20, message=str(sale.stats()))
    assert (sale.stats().expired, sale.stats().succeeded) == (20, 0)
    # the drops gave the group's quota back: 20 more fit (QuotaExceeded otherwise)
    rec.options(queue=qb, group="acme").enqueue_many([f"n{i}" for i in range(20)])
