"""Flow control on a 3-master Redis Cluster: groups, rate and concurrency limits, a
quota, a RateLimited hold and a cancel, on queues held by three different nodes, served
by one supervisor with two workers. Every script keeps to the queue's slot."""

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


@pytest.mark.timeout(120)
def test_flow_control_on_three_nodes(cluster: EmbeddedCluster, app: batchq.App,
                                     start_worker: WorkerFactory, log_path: Path) -> None:
    qa, qb, qc = queues_on_nodes(cluster, app.namespace, prefix="fq")
    rec, slow, limited = app.tasks["rec"], app.tasks["slow"], app.tasks["limited"]
    # qa: a rate-limited group beside a free one
    app.queue(qa).limit(group="slow", rate_per_s=10, burst=1)
    rec.options(queue=qa, group="slow").enqueue_many([f"s{i}" for i in range(10)])
    rec.options(queue=qa, group="free").enqueue_many([f"f{i}" for i in range(100)])
    # qb: a group of at most 2 at once, and a RateLimited hold
    app.queue(qb).limit(group="two", concurrency=2)
    slow.options(queue=qb, group="two").enqueue_many([(f"t{i}", 0.1) for i in range(8)])
    limited.options(queue=qb, group="prov").enqueue_many([("p0", 0.5), ("p1", 0.0)])
    # qc: a quota, a delayed grouped job and a cancel
    app.queue(qc).limit(group="acme", max_pending=3)
    acme = rec.options(queue=qc, group="acme")
    acme.enqueue_many(["a0", "a1"])
    gone = acme.options(delay_s=0.2).enqueue("a2")
    with pytest.raises(batchq.QuotaExceeded):
        acme.enqueue("a3")
    assert app.cancel(gone)

    start_worker([qa, qb, qc], "-p", "2", "-c", "10", serving=2)
    want = {f"s{i}" for i in range(10)} | {f"f{i}" for i in range(100)} | {"p0", "p1",
                                                                            "a0", "a1"}

    def done() -> set[str]:
        return {t for k, t, _, _ in read_runs(log_path) if k == "rec"}

    wait_until(lambda: done() >= want and len(read_runs(log_path, "slow")) == 8,
               timeout_s=60, interval_s=0.1, message="every job of the three queues ran")
    runs = read_runs(log_path)
    slow_starts = sorted(t for k, tok, _, t in runs if k == "rec" and tok.startswith("s"))
    assert slow_starts[-1] - slow_starts[0] >= 0.8  # 10 jobs at 10/s, burst 1
    (held,) = [t for k, _, _, t in runs if k == "limited"]
    p0 = [t for k, tok, _, t in runs if k == "rec" and tok == "p0"]
    assert p0 and p0[0] >= held + 0.45
    assert "a2" not in done()
    # every slot and quota count went back, on every node
    for q in (qa, qb, qc):
        k = app.keys(q)
        wait_until(lambda k=k: not app.clients.redis.hgetall(k.gstate).keys()
                   - {b"pos", b"vt", b"pturn", f"{group_hex('slow')}:t".encode(),
                      f"{group_hex('slow')}:ts".encode()},
                   timeout_s=10, message=f"flow counters of {q} settled")
    assert app.queue(qc).stats().grouped == 0
