"""Sharded queues on a real 3-master Redis Cluster: the shards of one queue
land on different nodes, real ``batchq worker`` processes drain them with every job run
exactly once, and changing the shard count of a live queue (down, then up) loses
nothing."""

from __future__ import annotations

import signal
from collections import Counter
from pathlib import Path

import pytest
from fixtures.cluster import *  # noqa: F403
from fixtures.cluster import WorkerFactory, queue_slot, read_runs
from helpers import wait_until

import batchq
from batchq.dev.cluster import EmbeddedCluster
from batchq.store.keys import shard_name

pytestmark = [pytest.mark.integration, pytest.mark.cluster, pytest.mark.timeout(180)]

SHARDS = 8


def spread_queue(cluster: EmbeddedCluster, namespace: str, shards: int = SHARDS) -> str:
    """A queue name whose first ``shards`` shards cover every node (each shard has its
    own hash tag; which node owns it depends on the name)."""
    for i in range(1000):
        name = f"hot{i}"
        owners = {cluster.slot_owner(queue_slot(namespace, shard_name(name, k)))
                  for k in range(shards)}
        if len(owners) == len(cluster.nodes):
            return name
    raise AssertionError("no queue name spreads over every node")


def nodes_of(cluster: EmbeddedCluster, app: batchq.App, queue: str) -> Counter[int]:
    """Ready jobs per node, read shard by shard."""
    per: Counter[int] = Counter()
    for q in app.queue(queue).shards():
        node = cluster.slot_owner(queue_slot(app.namespace, q.name))
        per[node] += q.stats().ready
    return per


def test_shards_land_on_every_node_and_a_drain_runs_each_job_once(
        cluster: EmbeddedCluster, app: batchq.App, start_worker: WorkerFactory,
        log_path: Path) -> None:
    hot = spread_queue(cluster, app.namespace)
    app.queue(hot, shards=SHARDS)
    rec = app.tasks["rec"].options(queue=hot)
    tokens = [f"t{i}" for i in range(16_000)]
    rec.enqueue_many(tokens)
    per_node = nodes_of(cluster, app, hot)
    assert sorted(per_node) == [0, 1, 2], per_node
    assert sum(per_node.values()) == 16_000
    assert app.queue(hot).stats().ready == 16_000

    # the workers know nothing of the shards but what the registry says
    sup = start_worker([hot], "-p", "2", "-c", "20", "--burst", serving=0)
    assert sup.wait(60) == 0, sup.read_log()
    counts = Counter(t for _, t, _, _ in read_runs(log_path, "rec"))
    assert len(counts) == 16_000 and set(counts.values()) == {1}
    st = app.queue(hot).stats()
    assert (st.ready, st.delayed, st.reserved, st.dead) == (0, 0, 0, 0)


def test_changing_the_shard_count_of_a_live_queue_loses_nothing(
        cluster: EmbeddedCluster, app: batchq.App, start_worker: WorkerFactory,
        log_path: Path) -> None:
    hot = spread_queue(cluster, app.namespace)
    app.queue(hot, shards=SHARDS)
    app.tasks["rec"].options(queue=hot).enqueue_many([f"a{i}" for i in range(4000)])
    sup = start_worker([hot], "-c", "20")
    expected = {f"a{i}" for i in range(4000)}
    # the next producers run with 3 shards, then with 12: the old shards drain, the
    # new ones are found by the running worker (the shard registry, read every 10 s)
    for label, count in (("b", 3), ("c", 12)):
        other = batchq.App(cluster.url, namespace=app.namespace)
        try:
            other.queue(hot, shards=count)
            task = other.task(name="rec")(lambda token: None)
            task.options(queue=hot).enqueue_many([f"{label}{i}" for i in range(4000)])
        finally:
            other.close()
        expected |= {f"{label}{i}" for i in range(4000)}
    wait_until(lambda: {t for _, t, _, _ in read_runs(log_path, "rec")} >= expected,
               timeout_s=60, interval_s=0.2, message="jobs were left behind")
    counts = Counter(t for _, t, _, _ in read_runs(log_path, "rec"))
    assert len(counts) == 12_000 and set(counts.values()) == {1}
    assert len(app.queue(hot).shards()) == 12
    wait_until(lambda: app.queue(hot).stats().pending == 0, timeout_s=10)
    assert sup.stop(signal.SIGTERM, timeout_s=30) == 0
    assert "Traceback" not in sup.read_log()
