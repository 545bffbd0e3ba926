"""The job context and progress on a real 3-master cluster: a queue on every node, each
job's context (its campaign and dedup key read from its queue's slot) and its progress
record (a key in its queue's slot), read back by ``job_info`` by id alone."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from apps.context_app import build, runs
from fixtures.cluster import *  # noqa: F403
from fixtures.cluster import queues_on_nodes
from helpers import wait_until
from workers import WorkerProcs, worker_env

import batchq
from batchq.dev.cluster import EmbeddedCluster

pytestmark = [pytest.mark.integration, pytest.mark.cluster]


@pytest.fixture
def capp(cluster: EmbeddedCluster, namespace: str, tmp_path: Path) -> Iterator[batchq.App]:
    a = build(cluster.url, namespace, str(tmp_path / "runs.log"))
    yield a
    a.close()


def test_context_and_progress_on_every_node(cluster: EmbeddedCluster, capp: batchq.App,
                                            namespace: str, tmp_path: Path) -> None:
    log = str(tmp_path / "runs.log")
    qs = queues_on_nodes(cluster, namespace, prefix="p")
    with capp.campaign("fall") as c:
        keyed = {q: capp.tasks["actx"].options(queue=q, campaign=c, key=f"k-{q}")
                 .enqueue(q) for q in qs}
    sent = {q: capp.tasks["send_sms"].options(queue=q).enqueue(f"+1555{i}")
            for i, q in enumerate(qs)}
    env = worker_env({"BATCHQ_REDIS_URL": cluster.url, "BATCHQ_TEST_NS": namespace,
                      "BATCHQ_TEST_LOG": log})
    with WorkerProcs("apps.context_app:app", env) as procs:
        procs.start("-q", ",".join(qs))
        wait_until(lambda: len(runs(log, "async")) >= 2 * len(qs)
                   and len(runs(log, "sent")) >= len(qs), timeout_s=60)
        for q, jid in sent.items():
            info = wait_until(lambda j=jid: (i := capp.job_info(j)).message and i,
                              timeout_s=20)
            assert info.queue == q and info.progress == 100
            assert info.message == next(r["provider_id"] for r in runs(log, "sent")
                                        if r["id"] == jid)
    rows = runs(log, "async")
    for q, jid in keyed.items():
        mine = {r["attempt"]: r for r in rows if r["id"] == jid}
        assert set(mine) == {1, 2}
        for r in mine.values():
            assert (r["queue"], r["campaign"], r["key"]) == (q, "fall", f"k-{q}")
            assert r["lease_deadline_ms"] > r["started_ms"]
