"""The operator side of flow control on a 3-master Redis Cluster: ``batchq limit``,
``batchq info`` and the flow-control metrics read queues held by three different nodes
in their pipelines (every command keyed by one queue's keys)."""

from __future__ import annotations

import json

import batchq
from batchq.dev.cluster import EmbeddedCluster
from batchq.metrics import QueueCollector

from .conftest import queues_on_nodes
from .test_cluster import _cli


def test_limit_info_and_metrics_across_nodes(cluster: EmbeddedCluster,
                                             app: batchq.App) -> None:
    qs = queues_on_nodes(cluster, app.namespace, prefix="ops")
    rec = app.tasks["rec"]
    for i, q in enumerate(qs):
        code, out, err = _cli(cluster, app.namespace, "limit", "set", q, "--group",
                              f"g{i}", "--rate", "5", "--concurrency", "2")
        assert code == 0 and f"group g{i}: rate 5/s concurrency 2" in out, err
        app.queue(q).hold(900, group=f"g{i}")
        rec.options(queue=q, group=f"g{i}").enqueue_many([f"x{i}", f"y{i}"])

    code, out, err = _cli(cluster, app.namespace, "info", "--json")
    assert code == 0, err
    queues = json.loads(out)["queues"]
    for i, q in enumerate(qs):
        f = queues[q]["flow"]
        assert (f["grouped"], f["groups_waiting"]) == (2, 1)
        [w] = f["waiting_groups"]
        assert (w["group"], w["state"], w["pending"]) == (f"g{i}", "waiting", 2)
        assert [x["group"] for x in f["limits"]] == [f"g{i}"]
    code, out, err = _cli(cluster, app.namespace, "limit", "list", qs[2], "--json")
    assert code == 0, err
    assert json.loads(out)["waiting_groups"][0]["group"] == "g2"

    fams = {m.name: m for m in QueueCollector(app).collect()}
    waiting = {(s.labels["queue"], s.labels["group"]): s.value
               for s in fams["batchq_group_waiting_seconds"].samples}
    assert set(waiting) == {(q, f"g{i}") for i, q in enumerate(qs)}
    assert all(800 < v <= 900 for v in waiting.values())
    rates = {(s.labels["queue"], s.labels["group"]): s.value
             for s in fams["batchq_limit_rate_per_second"].samples}
    assert rates == {(q, f"g{i}"): 5.0 for i, q in enumerate(qs)}
    grouped = {s.labels["queue"]: s.value
               for s in fams["batchq_queue_grouped_jobs"].samples}
    assert all(grouped[q] == 2 for q in qs)

    for i, q in enumerate(qs):
        code, out, err = _cli(cluster, app.namespace, "limit", "rm", q, "--group", f"g{i}")
        assert code == 0 and "removed" in out, err
