"""Issue 10: a poison job must not take its neighbours down.

A job that kills its process (``os._exit``, a segfault, the OOM killer) used to cost
every job its process had reserved an attempt, prefetched ones that never started
included: one ``os._exit(1)`` among 300 healthy jobs (``max_attempts=3``, ``-p 1 -c 1``)
sent 99 healthy jobs to the dead-letter store as ``lease_expired``.

Now (pop.lua's crash marks): an expired lease is refunded unless its job was marked as
started; a recovered job runs alone with its start recorded; so the poison is charged
every time after the first and dies as ``crashed_worker``, while its neighbours end
succeeded.
"""

from __future__ import annotations

import pytest
from fixtures.faults import *  # noqa: F403
from fixtures.fleet import Fleet

pytestmark = pytest.mark.fault


def test_a_job_that_kills_its_worker_takes_no_neighbour_down(fleet: Fleet) -> None:
    """Fixed: 99 of 300 healthy jobs were dead-lettered as ``lease_expired``."""
    work = fleet.app.tasks["work"].options(max_attempts=3)
    healthy = [f"n{i}" for i in range(300)]
    work.enqueue_many([(t, 0.0) for t in healthy[:150]])
    work.enqueue("poison", 0.0, "exit")
    work.enqueue_many([(t, 0.0) for t in healthy[150:]])

    proc = fleet.drain("-p", "1", "-c", "1", "--lease-s", "1", timeout_s=90)

    poison_runs = [r for r in fleet.runs() if r.token == "poison"]
    died = {r.pid for r in poison_runs}
    dead = fleet.app.queue("default").dead_jobs()
    assert [(d.args[0], d.reason) for d in dead] == [("poison", "crashed_worker")], dead
    # the first two deaths cannot be pinned on it; held by two dead workers, it then
    # runs alone with its start recorded and is charged: 3 attempts
    assert len(poison_runs) == 5 and len(died) == 5, poison_runs
    assert "3 times; 5 workers died holding it" in dead[0].error_message, dead[0].error_message
    report = fleet.check([*healthy, "poison"], killed_pids=died)
    print(f"\nchecker: {report.summary()}; poison ran on {len(died)} processes")
    assert report.valid, report.details()
    assert (report.completed, report.dead, len(report.lost)) == (300, 1, 0)
    assert set(fleet.completed()) == set(healthy)
    assert fleet.leftovers() == []
    assert proc.read_log().count("died (exit code 1)") == 5
