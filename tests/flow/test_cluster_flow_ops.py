"""The operator side of flow control on a 3-master Redis Cluster: ``batchq limit``,
``batchq info`` and the flow-control metrics read queues held by three different nodes
in their pipelines (every command keyed by one queue's keys)."""

from __future__ import annotations

import json

import pytest
from cluster.test_cluster import _cli
from fixtures.cluster import *  # noqa: F403
from fixtures.cluster import queues_on_nodes

import batchq
from batchq.dev.cluster import EmbeddedCluster
from batchq.ops.metrics import QueueCollector

pytestmark = [pytest.mark.e2e, pytest.mark.cluster]


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


def test_hold_release_and_audit_across_nodes(cluster: EmbeddedCluster,
                                             app: batchq.App) -> None:
    """``batchq hold`` / ``release`` / ``resume`` on queues held by three nodes (the hold
    script keyed by each queue), every action in the audit log (a stream outside every
    queue's tag), and grouped jobs counted by priority there too."""
    from batchq.ops import audit

    qs = queues_on_nodes(cluster, app.namespace, prefix="hr")
    rec = app.tasks["rec"]
    for i, q in enumerate(qs):
        rec.options(queue=q, group=f"g{i}", priority=4).enqueue_many([f"a{i}", f"b{i}"])
        code, out, err = _cli(cluster, app.namespace, "hold", q, "600")
        assert code == 0 and "is held until" in out, err
        code, out, err = _cli(cluster, app.namespace, "hold", q, "300", "--group", f"g{i}")
        assert code == 0, err
        code, out, err = _cli(cluster, app.namespace, "resume", q)
        assert code == 0 and "by an operator" in out and "1 group is held" in out, err
        st = app.queue(q).stats()
        assert st.ready_by_priority == {4: 2} and st.oldest_age_s >= 0
        code, out, err = _cli(cluster, app.namespace, "release", q, "--group", f"g{i}")
        assert code == 0 and "released" in out, err
        code, out, err = _cli(cluster, app.namespace, "release", q)
        assert code == 0 and "released" in out, err
        assert app.queue(q).holds() == batchq.flow.limits.Holds()

    entries = audit.read(app.redis, app.namespace, 100)
    assert [(e.action, e.result) for e in reversed(entries)] == [
        (a, "ok") for _ in qs for a in ("hold", "hold", "resume", "release", "release")]
    assert {e.target for e in entries} >= {f"queue {q}" for q in qs}
