"""Campaigns under SIGKILL: workers are killed mid-campaign (a child, then the whole
fleet), over two queues; then a fresh burst fleet drains. The checker confirms every job
ran or is dead, the campaign's counts are exact (a job redelivered after its worker died
counts once; dead jobs count as finished) and ``on_complete`` was enqueued exactly once
with those counts.
"""

from __future__ import annotations

import pytest
from fixtures.faults import *  # noqa: F403
from fixtures.fleet import Fleet

pytestmark = pytest.mark.fault

QUEUES = ("default", "q2")


def _done_runs(fleet: Fleet) -> list[str]:
    return sorted({f"{r.token} {r.job_id}" for r in fleet.runs()
                   if r.token.startswith("done:") and r.completed})


def test_sigkill_mid_campaign_counts_exactly_and_completes_once(fleet: Fleet) -> None:
    app = fleet.app
    work = app.tasks["work"]
    c = app.campaign("killed-fleet", on_complete=app.tasks["campaign_done"])
    ok = [f"c{i}" for i in range(2400)]
    dead = [f"x{i}" for i in range(20)]
    work.options(campaign=c).enqueue_many([(t, 0.3) for t in ok[:1200]])
    work.options(campaign=c, queue="q2").enqueue_many([(t, 0.3) for t in ok[1200:]])
    work.options(campaign=c).enqueue_many([(t, 0.0, "raise:custom:always") for t in dead])
    c.seal()
    assert c.stats().total == 2420

    sup = fleet.start("-q", ",".join(QUEUES), "-p", "2", "-c", "100", "--fetch-batch",
                      "50", "--lease-s", "2")
    kids = fleet.wait_children(sup, 2)
    fleet.until(lambda: len(fleet.completed()) >= 200, 20, "200 jobs done")
    victim = next(iter(kids))
    fleet.kill(victim)
    fleet.until(lambda: len(fleet.completed()) >= 900, 30, "900 jobs done")
    assert not c.stats().done
    fleet.kill_fleet(sup)
    s = c.stats()
    assert s.total == s.succeeded + s.dead + s.cancelled + s.pending and s.pending > 0, s

    # the drain settles the rest (expired leases included); its follow-up completes the
    # campaign and enqueues on_complete, which a second drain runs
    fleet.drain("-q", ",".join(QUEUES), "-p", "2", "-c", "200", "--lease-s", "2")
    fleet.until(lambda: c.stats().done, 30, "the campaign completed")
    fleet.drain("-q", ",".join(QUEUES), "-c", "10")
    s = c.stats()
    assert (s.total, s.succeeded, s.dead, s.cancelled, s.pending) == (2420, 2400, 20, 0, 0)
    done = _done_runs(fleet)
    assert len(done) == 1, done
    assert done[0].startswith("done:killed-fleet:2420:2400:20:0:0 "), done

    report = fleet.check(ok + dead + [done[0].split()[0]], queues=QUEUES)
    print(f"\nchecker: {report.summary()} killed={sorted(fleet.killed)}")
    assert report.valid, report.details()
    assert fleet.leftovers(QUEUES) == []
