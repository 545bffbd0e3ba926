"""A cancel never stalls a tenant, on a 3-master Redis Cluster: thousands of cancelled
jobs in front of a second campaign's jobs, in a rate-limited group (a cancelled
campaign), a concurrency-limited group (jobs cancelled one by one) and a sharded queue
spread over the nodes, served by one worker. The live jobs run within a few times what
their limits need, not a block timeout (5 s) per burst of dropped jobs; a cancel frees
the group's quota at once, with no worker running."""

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

CANCELLED = 2000
LIVE = 40


@pytest.mark.timeout(120)
def test_cancelled_jobs_never_stall_a_group(cluster: EmbeddedCluster, app: batchq.App,
                                            start_worker: WorkerFactory,
                                            log_path: Path) -> None:
    qa, qb, _ = queues_on_nodes(cluster, app.namespace, prefix="cq")
    qs = f"{qa}x"  # a sharded queue: its shards land on several nodes
    rec, slow = app.tasks["rec"], app.tasks["slow"]
    rate, conc, secs = 40, 2, 0.02
    app.queue(qa).limit(group="rated", rate_per_s=rate)
    app.queue(qb).limit(group="slots", concurrency=conc)
    app.queue(qs, shards=3).limit(group="rated", rate_per_s=rate)

    first, second = app.campaign("first"), app.campaign("second")
    rec.options(queue=qa, group="rated", campaign=first).enqueue_many(
        [f"xa{i}" for i in range(CANCELLED)])
    rec.options(queue=qs, group="rated", campaign=first).enqueue_many(
        [f"xs{i}" for i in range(CANCELLED)])
    rec.options(queue=qs, campaign=first).enqueue_many([f"xp{i}" for i in range(CANCELLED)])
    by_id = slow.options(queue=qb, group="slots").enqueue_many(
        [(f"xb{i}", secs) for i in range(CANCELLED)])
    rec.options(queue=qa, group="rated", campaign=second).enqueue_many(
        [f"la{i}" for i in range(LIVE)])
    rec.options(queue=qs, group="rated", campaign=second).enqueue_many(
        [f"ls{i}" for i in range(LIVE)])
    rec.options(queue=qs, campaign=second).enqueue_many([f"lp{i}" for i in range(LIVE)])
    slow.options(queue=qb, group="slots").enqueue_many([(f"lb{i}", secs) for i in range(LIVE)])
    assert first.cancel() == 3 * CANCELLED
    second.seal()
    assert sum(app.cancel(j) for j in by_id) == CANCELLED

    # the groups' slowest need: LIVE jobs at `rate` (a few seconds for start-up and a
    # loaded machine on top, three times over)
    bound_s = 3 * LIVE / rate + 10
    t0 = time.monotonic()
    start_worker([qa, qb, qs], "-c", "10")

    def live() -> int:
        return sum(1 for _, tok, _, _ in read_runs(log_path) if tok.startswith("l"))

    wait_until(lambda: live() >= 4 * LIVE, timeout_s=bound_s, interval_s=0.05,
               message=f"the live jobs did not all run within {bound_s:.0f}s")
    assert time.monotonic() - t0 < bound_s
    assert not any(tok.startswith("x") for _, tok, _, _ in read_runs(log_path))
    wait_until(lambda: first.stats().pending == 0, timeout_s=20,
               message=str(first.stats()))
    st = first.stats()
    assert (st.cancelled, st.succeeded) == (3 * CANCELLED, 0)
    assert second.stats().succeeded == 3 * LIVE


def test_cancel_frees_the_quota_at_once(cluster: EmbeddedCluster, app: batchq.App) -> None:
    """No worker runs: cancelling the jobs is what lets the next one in."""
    q, _, _ = queues_on_nodes(cluster, app.namespace, prefix="qq")
    app.queue(q).limit(group="acme", max_pending=3)
    acme = app.tasks["rec"].options(queue=q, group="acme")
    ids = [acme.enqueue(f"a{i}") for i in range(2)] + [acme.options(delay_s=60).enqueue("d")]
    with pytest.raises(batchq.QuotaExceeded):
        acme.enqueue("over")
    assert all(app.cancel(j) for j in ids)
    acme.enqueue_many(["b0", "b1", "b2"])
    with pytest.raises(batchq.QuotaExceeded):
        acme.enqueue("over")
