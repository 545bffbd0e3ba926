"""Cancelling frees a group's quota (``max_pending``) at once: no worker has to pop the
cancelled jobs first. And a cancelled job's quota is given back once: the pop that
drops it later does not count it out again."""

from __future__ import annotations

import pytest
from fixtures.faults import *  # noqa: F403
from fixtures.fleet import Fleet

import batchq
from batchq.flow.limits import group_hex
from batchq.store.scripts import calls
from batchq.store.scripts.replies import decode_pop_reply

pytestmark = pytest.mark.fault


def test_cancel_frees_the_quota_without_a_worker(fleet: Fleet) -> None:
    app = fleet.app
    app.queue("default").limit(group="acme", max_pending=3)
    acme = app.tasks["work"].options(group="acme")
    ids = acme.enqueue_many([("c0",), ("c1",), ("c2",)])
    with pytest.raises(batchq.QuotaExceeded):
        acme.enqueue("over")
    assert all(app.cancel(j) for j in ids)
    # no worker runs: the cancel itself gave the three places back
    acme.enqueue_many([("n0",), ("n1",), ("n2",)])
    with pytest.raises(batchq.QuotaExceeded):
        acme.enqueue("over")

    # a pop drops the three cancelled jobs and leases the three new ones: they still
    # hold the quota while they run (the drop did not count the cancelled ones out twice)
    k = app.keys("default")
    got = decode_pop_reply(app.sync_scripts.call(calls.pop(k, 3, 30_000, 100)))
    assert len(got.jobs) == 3
    assert int(fleet.r.hget(k.stats, "cancelled") or 0) == 3
    with pytest.raises(batchq.QuotaExceeded):
        acme.enqueue("over")


def test_the_fleet_runs_only_what_was_not_cancelled(fleet: Fleet) -> None:
    app = fleet.app
    app.queue("default").limit(group="acme", max_pending=3)
    acme = app.tasks["work"].options(group="acme")
    gone = [*acme.enqueue_many([("c0",), ("c1",)]), acme.options(delay_s=60).enqueue("c2")]
    assert all(app.cancel(j) for j in gone)
    acme.enqueue_many([("n0",), ("n1",), ("n2",)])
    fleet.drain("-c", "4")
    assert {r.token for r in fleet.runs()} == {"n0", "n1", "n2"}
    report = fleet.check(["n0", "n1", "n2"])
    assert report.valid and report.completed == 3, report.details()
    # every place is free again
    assert not fleet.r.hget(app.keys("default").gstate, f"{group_hex('acme')}:n")
    acme.enqueue_many([("m0",), ("m1",), ("m2",)])
