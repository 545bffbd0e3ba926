"""``enqueue_many(group_fn=...)`` on a 3-master Redis Cluster: a fan-out (groups, a
campaign, a dedup key per row) written in one call per queue, to queues held by three
different nodes (chunks pipelined, each script call in its queue's slot), then served:
every job runs once, the campaign completes once, every group's quota count goes back."""

from __future__ import annotations

from pathlib import Path

import pytest
from fixtures.cluster import *  # noqa: F403
from fixtures.cluster import WorkerFactory, queues_on_nodes, read_runs
from helpers import wait_until

import batchq
from batchq.dev.cluster import EmbeddedCluster
from batchq.flow.limits import group_hex

pytestmark = [pytest.mark.integration, pytest.mark.cluster]

ROWS = 2500  # three chunks per queue, one pipelined window after the first
GROUPS = 50


@pytest.mark.timeout(120)
def test_a_fanout_over_three_nodes_in_one_call_per_queue(cluster: EmbeddedCluster,
                                                         app: batchq.App,
                                                         start_worker: WorkerFactory,
                                                         log_path: Path) -> None:
    queues = queues_on_nodes(cluster, app.namespace, prefix="gf")
    rec, done_task = app.tasks["rec"], app.tasks["campaign_done"]
    c = app.campaign("fanout-nodes", on_complete=done_task)
    for q in queues:
        app.queue(q).limit(group="*", rate_per_s=1_000_000)
        rows = [f"{q}-{i}" for i in range(ROWS)]
        ids = rec.options(queue=q, campaign=c).enqueue_many(
            rows, key_fn=lambda row: row, group_fn=lambda row: f"t{hash(row) % GROUPS}")
        assert len(set(ids)) == ROWS
        # run again: every key held, the holders' ids, nothing written
        again = rec.options(queue=q, campaign=c).enqueue_many(
            rows, key_fn=lambda row: row, group_fn=lambda row: f"t{hash(row) % GROUPS}")
        assert again == ids
        k = app.keys(q)
        assert app.clients.redis.zcard(k.gready) == ROWS
        counts = app.clients.redis.hmget(k.gstate, [f"{group_hex(f't{g}')}:n"
                                                    for g in range(GROUPS)])
        assert sum(int(n or 0) for n in counts) == ROWS
    c.seal()
    assert c.stats().total == 3 * ROWS

    start_worker([*queues, "default"], "-p", "2", "-c", "20", serving=2)

    def finished() -> list[str]:
        return [t for _, t, _, _ in read_runs(log_path, "campaign_done")]

    wait_until(lambda: finished(), timeout_s=90, interval_s=0.2,
               message="the campaign completed")
    ran = [t for k, t, _, _ in read_runs(log_path) if k == "rec"]
    assert len(ran) == len(set(ran)) == 3 * ROWS
    assert finished() == [f"fanout-nodes:{3 * ROWS}:{3 * ROWS}:0:0"]
    for q in queues:
        k = app.keys(q)
        wait_until(lambda k=k: not [f for f in app.clients.redis.hkeys(k.gstate)
                                    if f.endswith(b":n")],
                   timeout_s=10, message=f"quota counts of {q} settled")
