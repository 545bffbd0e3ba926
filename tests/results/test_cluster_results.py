"""Results, status and cancel on a real 3-master cluster: a job id leads to its queue's
slot, the scripts publish on the job's channel from whichever node owns the queue, and
the per-process listener (one node) hears them."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from apps.results_app import build
from fixtures.cluster import *  # noqa: F403
from fixtures.cluster import queues_on_nodes
from workers import WorkerProcs, worker_env

import batchq
from batchq.dev.cluster import EmbeddedCluster

pytestmark = [pytest.mark.integration, pytest.mark.cluster]


@pytest.fixture
def rapp(cluster: EmbeddedCluster, namespace: str, tmp_path: Path) -> Iterator[batchq.App]:
    a = build(cluster.url, namespace, str(tmp_path / "runs.log"))
    yield a
    a.close()


def test_results_status_and_cancel_on_every_node(cluster: EmbeddedCluster,
                                                 rapp: batchq.App, namespace: str,
                                                 tmp_path: Path) -> None:
    qs = queues_on_nodes(cluster, namespace, prefix="r")
    square, boom = rapp.tasks["square"], rapp.tasks["boom"]
    ok = [square.options(queue=q).enqueue(i) for i, q in enumerate(qs)]
    dead = [boom.options(queue=q).enqueue(f"no {q}") for q in qs]
    gone = [square.options(queue=q).enqueue(99) for q in qs]
    later = [square.options(queue=q, delay_s=3600).enqueue(1) for q in qs]
    for jid in ok:
        assert rapp.job_status(jid) == "ready"
    for jid in later:
        assert rapp.job_status(jid) == "delayed"
        assert rapp.cancel(jid) is True
    for jid in gone:
        assert rapp.cancel(jid) is True
    env = worker_env({"BATCHQ_REDIS_URL": cluster.url, "BATCHQ_TEST_NS": namespace,
                      "BATCHQ_TEST_LOG": str(tmp_path / "runs.log")})
    # waiters block before any worker runs: the wake-up crosses nodes
    got: dict[str, object] = {}

    def wait(jid: str) -> None:
        got[jid] = rapp.result(jid, timeout_s=30)

    threads = [threading.Thread(target=wait, args=(jid,)) for jid in ok]
    for t in threads:
        t.start()
    time.sleep(0.5)
    assert not got
    with WorkerProcs("apps.results_app:app", env) as procs:
        procs.start("-q", ",".join(qs))
        for t in threads:
            t.join(30)
        assert got == {jid: {"x": i, "square": i * i} for i, jid in enumerate(ok)}
        for i, jid in enumerate(ok):
            assert rapp.result(jid, timeout_s=30) == {"x": i, "square": i * i}
            assert rapp.job_status(jid) == "succeeded"
        for jid, q in zip(dead, qs, strict=True):
            with pytest.raises(batchq.JobDead, match=f"no {q}"):
                asyncio.run(rapp.aresult(jid, timeout_s=30))
        for jid in gone + later:
            assert rapp.job_status(jid) == "cancelled"
            with pytest.raises(batchq.JobCancelled):
                rapp.result(jid, timeout_s=5)
