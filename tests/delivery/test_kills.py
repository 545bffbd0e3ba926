"""Faults 1 and 2: kill -9 of workers and supervisors, SIGTERM cut short by SIGKILL.

Every test ends the same way: a fresh ``--burst`` fleet drains what is left, then the
checker compares the tokens whose enqueue returned with the run records the handlers
wrote to files, and Redis must hold nothing reserved, in flight or stray.
"""

from __future__ import annotations

import os
import signal
import time

import pytest
from fixtures.faults import *  # noqa: F403
from fixtures.fleet import Fleet, alive

pytestmark = pytest.mark.fault


def _report(fleet: Fleet, tokens: list[str]) -> None:
    report = fleet.check(tokens)
    print(f"\nchecker: {report.summary()} killed={sorted(fleet.killed)}")
    assert report.valid, report.details()
    assert fleet.leftovers() == []


def test_kill_9_of_a_child_and_then_of_the_whole_fleet(fleet: Fleet) -> None:
    tokens = [f"k{i}" for i in range(3000)]
    fleet.app.tasks["work"].enqueue_many([(t, 0.3) for t in tokens])
    sup = fleet.start("-p", "2", "-c", "100", "--fetch-batch", "100", "--lease-s", "2")
    kids = fleet.wait_children(sup, 2)

    # each child holds its 100 running jobs and the few it will start next (0.3 s jobs:
    # the prefetch is sized from their run time, not c + 2 x fetch-batch = 300)
    fleet.until(lambda: fleet.stats().reserved >= 180 and len(fleet.completed()) >= 100,
                20, "hundreds of jobs reserved")
    runs = fleet.runs()
    victim = next(p for p in kids if any(r.pid == p for r in runs))
    held = fleet.stats().reserved
    fleet.kill(victim)
    replacement = fleet.until(lambda: (k := fleet.children(sup)) and victim not in k
                              and len(k) == 2 and (k - kids), 10, "a replacement child")
    (new,) = replacement
    fleet.until(lambda: any(r.pid == new for r in fleet.runs()), 10, "the replacement runs")
    done = len(fleet.completed())
    fleet.until(lambda: len(fleet.completed()) >= done + 300, 20, "300 more jobs done")

    killed = fleet.kill_fleet(sup)  # supervisor first, then each child
    assert len(killed) == 3
    left = fleet.stats()
    assert left.reserved > 0, left  # the dead fleet's leases are still there

    fleet.drain("-p", "2", "-c", "200", "--fetch-batch", "100", "--lease-s", "2")
    runs = fleet.runs()
    print(f"\nreserved when the child was killed: {held}; after the fleet was killed: "
          f"{left.reserved}; redelivered jobs run as attempt >= 2: "
          f"{len({r.token for r in runs if r.attempt >= 2})}")
    assert any(r.pid == victim and not r.completed for r in runs), "victim ran nothing"
    _report(fleet, tokens)


@pytest.mark.parametrize("after_grace_s", [-0.3, 0.0], ids=["during-grace", "at-grace-end"])
def test_sigterm_mid_batch_then_sigkill_right_after_the_grace(fleet: Fleet,
                                                              after_grace_s: float) -> None:
    shutdown_timeout = 1.0
    short = [f"s{i}" for i in range(600)]
    long = [f"l{i}" for i in range(60)]
    work = fleet.app.tasks["work"]
    # interleaved: each fetch brings both kinds
    items = [(t, 0.2) for t in short]
    for i, t in enumerate(long):
        items.insert(i * 10, (t, 2.0))
    work.enqueue_many(items)
    sup = fleet.start("-p", "2", "-c", "40", "--fetch-batch", "40", "--lease-s", "2",
                      "--shutdown-timeout", str(shutdown_timeout))
    kids = fleet.wait_children(sup, 2)
    # 2 x 40 running (and about one prefetched each: the prefetch follows the run time)
    fleet.until(lambda: len(fleet.completed()) >= 60 and fleet.stats().reserved >= 70, 20,
                "a batch in flight")

    os.kill(sup.pid, signal.SIGTERM)
    time.sleep(shutdown_timeout + after_grace_s)
    still = {p for p in kids | {sup.pid} if alive(p)}
    fleet.kill(*still)
    sup.wait(10)
    fleet.until(lambda: not any(alive(p) for p in kids), 10, "children gone")
    after = fleet.stats()
    print(f"\nkilled {len(still)} of 3 processes {after_grace_s}s after the grace; left: "
          f"{after}")

    if not still & kids:  # every child had exited cleanly: nothing may wait for a lease
        assert (after.reserved, fleet.r.hlen(fleet.app.keys("default").inflight)) == (0, 0)

    fleet.drain("-c", "200", "--lease-s", "2")
    runs = fleet.runs()
    cut = [r for r in runs if r.token.startswith("l") and not r.completed]
    assert cut, "no long job was interrupted"
    _report(fleet, short + long)
