"""Job events on a real 3-master cluster: a queue on every node, each queue's stream and
config in its own slot, written by the workers' scripts and read by ``app.events`` over
all of them (follow mode included), with the same numbering and kinds as on one
server."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from apps.events_app import build
from fixtures.cluster import *  # noqa: F403
from fixtures.cluster import queues_on_nodes
from workers import WorkerProcs, worker_env

import batchq
from batchq.dev.cluster import EmbeddedCluster

pytestmark = [pytest.mark.integration, pytest.mark.cluster]


@pytest.fixture
def eapp(cluster: EmbeddedCluster, namespace: str, tmp_path: Path) -> Iterator[batchq.App]:
    a = build(cluster.url, namespace, str(tmp_path / "runs.log"))
    yield a
    a.close()


def test_events_on_every_node(cluster: EmbeddedCluster, eapp: batchq.App, namespace: str,
                              tmp_path: Path) -> None:
    qs = queues_on_nodes(cluster, namespace, prefix="e")
    for q in qs:
        eapp.queue(q).events(max_len=1000)
    followed: list[batchq.Event] = []

    def follow() -> None:
        for e in eapp.events(qs, since="$", follow=True):
            followed.append(e)
            if sum(x.kind in ("succeeded", "dead") for x in followed) == 3 * len(qs):
                return

    th = threading.Thread(target=follow, daemon=True)
    th.start()
    jobs = {}
    for q in qs:
        jobs[q] = (eapp.tasks["ok"].options(queue=q).enqueue(q),
                   eapp.tasks["flaky"].options(queue=q).enqueue(q),
                   eapp.tasks["doomed"].options(queue=q).enqueue(q))
    env = worker_env({"BATCHQ_REDIS_URL": cluster.url, "BATCHQ_TEST_NS": namespace,
                      "BATCHQ_TEST_LOG": str(tmp_path / "runs.log")})
    with WorkerProcs("apps.events_app:app", env) as procs:
        procs.start("-q", ",".join(qs))
        th.join(timeout=60)
    assert not th.is_alive()
    evs = list(eapp.events(qs))
    assert sorted(e.id for e in followed) == sorted(e.id for e in evs)
    for q, (ok, flaky, doomed) in jobs.items():
        mine = [e for e in evs if e.queue == q]
        assert [int(e.id.split("-")[1]) for e in mine] == list(range(1, len(mine) + 1))
        kinds = {j: [e.kind for e in mine if e.job_id == j] for j in (ok, flaky, doomed)}
        assert kinds[ok] == ["started", "succeeded"]
        assert kinds[flaky] == ["started", "retried", "started", "succeeded"]
        assert kinds[doomed] == ["started", "retried", "started", "dead"]
