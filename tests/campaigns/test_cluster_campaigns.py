"""Campaigns and dedup keys on a 3-master Redis Cluster: one campaign's jobs on queues
held by three different nodes (and its record in a slot of its own), two worker
processes settling them at once, exactly one completion; a cancel over two nodes."""

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
def test_campaign_over_three_nodes_completes_once(cluster: EmbeddedCluster,
                                                  app: batchq.App,
                                                  start_worker: WorkerFactory,
                                                  log_path: Path) -> None:
    qa, qb, qc = queues_on_nodes(cluster, app.namespace, prefix="cq")
    rec, flaky, done_task = app.tasks["rec"], app.tasks["flaky"], app.tasks["campaign_done"]

    c = app.campaign("over-nodes", on_complete=done_task)
    for q in (qa, qb):
        rec.options(queue=q, campaign=c).enqueue_many([f"{q}-{i}" for i in range(300)])
    ids = rec.options(queue=qc, campaign=c).enqueue_many(
        [f"{qc}-{i % 300}" for i in range(400)], key_fn=lambda token: token)
    assert len(set(ids)) == 300  # 100 repeated keys: the holder's id, nothing written
    flaky.options(queue=qb, campaign=c).enqueue_many(["F0", "F1"])  # die: never fixed
    c.seal()
    assert c.stats().total == 902 and set(c.stats().queues) == {qa, qb, qc}

    stop = app.campaign("stopped", on_complete=done_task)
    for q in (qa, qc):
        rec.options(queue=q, campaign=stop).enqueue_many([f"x{q}-{i}" for i in range(50)])
    assert stop.cancel() == 100
    with pytest.raises(batchq.CampaignClosed):
        rec.options(queue=qb, campaign=stop).enqueue("late")

    start_worker([qa, qb, qc, "default"], "-p", "2", serving=2)

    def finished() -> list[str]:
        return [t for _, t, _, _ in read_runs(log_path, "campaign_done")]

    wait_until(lambda: len(finished()) >= 2, timeout_s=60, interval_s=0.1,
               message="both campaigns completed")
    time.sleep(0.5)  # a second completion would be enqueued at once: give it a chance
    assert sorted(finished()) == ["over-nodes:902:900:2:0", "stopped:100:0:0:100"]
    s = c.stats()
    assert (s.done, s.pending, s.succeeded, s.dead) == (True, 0, 900, 2)
    assert not any(t.startswith("x") for _, t, _, _ in read_runs(log_path, "rec"))
    assert {s.id for s in app.campaigns()} >= {"over-nodes", "stopped"}
