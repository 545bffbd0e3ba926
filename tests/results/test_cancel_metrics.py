"""The outcome counters on ``/metrics`` add up with cancels:
``batchq_jobs_enqueued_total == succeeded + dead + batchq_jobs_cancelled_total +
pending`` exactly, after a run with a cancelled campaign, ready and delayed jobs
cancelled by id (plain and grouped), dead jobs and jobs still delayed."""

from __future__ import annotations

import pytest
from fixtures.faults import *  # noqa: F403
from fixtures.fleet import Fleet
from helpers import free_port

pytestmark = [pytest.mark.fault, pytest.mark.timeout(90)]


def test_enqueued_is_succeeded_dead_cancelled_and_pending(fleet: Fleet) -> None:
    app = fleet.app
    work = app.tasks["work"]

    @app.task(name="ghost")  # the workers' app has no such task: dead, unknown_task
    def ghost(n: int) -> None:
        raise AssertionError("never runs")

    ok = [f"ok{i}" for i in range(40)]
    work.enqueue_many([(t,) for t in ok])
    ghost.enqueue_many([(i,) for i in range(3)])
    camp = app.campaign("gone")
    work.options(campaign=camp).enqueue_many([(f"c{i}",) for i in range(300)])
    assert camp.cancel() == 300
    by_id = work.enqueue_many([(f"r{i}",) for i in range(100)])
    by_id += work.options(group="acme").enqueue_many([(f"g{i}",) for i in range(50)])
    by_id += work.options(delay_s=600).enqueue_many([(f"d{i}",) for i in range(10)])
    assert sum(app.cancel(j) for j in by_id) == 160
    work.options(delay_s=600).enqueue_many([(f"p{i}",) for i in range(5)])  # pending

    port = free_port()
    sup = fleet.start("-p", "1", "-c", "10", "--metrics-port", str(port))
    fleet.wait_children(sup, 1)
    fleet.wait_completed(ok, 30)
    q = app.queue("default")
    fleet.until(lambda: (q.stats().ready, q.stats().reserved, len(q.dead_ids())) == (0, 0, 3),
                20, "everything ready dropped or run")
    rec = fleet.reconcile(port)
    assert rec.ok, rec
    assert (rec.enqueued, rec.succeeded, rec.dead, rec.cancelled, rec.queued) == \
        (40 + 3 + 300 + 160 + 5, 40, 3, 460, 5), rec
    assert not {r.token for r in fleet.runs()} - set(ok)
