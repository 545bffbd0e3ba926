"""Expiry (``options(expires_s=...)``, ``expires_at``, a campaign's ``expires_at``) with
real worker processes: a job not started by its deadline never runs, and is counted
``expired`` in the queue's stats, its campaign's stats, ``/metrics`` and the events;
``keep_expired`` keeps it in dead with reason ``expired``; an expired grouped job frees
its quota and takes no rate token; a delayed job expiring while delayed and a retry past
the deadline are dropped too. Bad input writes nothing."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

import pytest
from fixtures.faults import *  # noqa: F403
from fixtures.fleet import Fleet

import batchq
from batchq.ops.metrics import QueueCollector
from batchq.store.scripts import calls
from batchq.store.scripts.replies import decode_pop_reply

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]


def _metric(app: batchq.App, name: str) -> dict[str, float]:
    fams = {m.name: m for m in QueueCollector(app).collect()}
    return {s.labels["queue"]: s.value for s in fams[name].samples
            if s.name == name + "_total"}


def test_expired_jobs_never_run_and_are_counted(fleet: Fleet) -> None:
    app = fleet.app
    q = app.queue("default")
    q.events(True)
    work = app.tasks["work"]
    late = work.options(expires_s=0.3).enqueue_many([(f"x{i}",) for i in range(20)])
    kept = work.options(expires_s=0.3, keep_expired=True).enqueue("k0")
    fresh = [f"ok{i}" for i in range(10)]
    work.enqueue_many([(t,) for t in fresh])
    long = work.options(expires_s=300).enqueue("ok-long")
    time.sleep(0.5)
    fleet.drain("-c", "4")
    assert {r.token for r in fleet.runs()} == {*fresh, "ok-long"}
    st = q.stats()
    assert (st.expired, st.pending, st.dead) == (21, 0, 1), st
    (dead,) = q.dead_jobs()
    assert (dead.id, dead.reason) == (kept, "expired")
    assert _metric(app, "batchq_jobs_expired") == {"default": 21}
    expired = [e for e in app.events(["default"], since="0") if e.kind == "expired"]
    assert sorted(e.job_id for e in expired) == sorted([*late, kept])
    # the expired ones are gone from Redis: no tombstone, no deadline, no jobmeta left
    # but the "X" status mark of the dropped ones, removed by their "~" member later;
    # the deadline of the job that ran stays until it is due (the sweep then drops it)
    k = app.keys("default")
    for key in (k.jobmeta, k.pending):
        assert fleet.r.hlen(key) == 0, key
    assert fleet.r.hgetall(k.cancel) == {j.encode(): b"X" for j in late}
    assert sorted(fleet.r.zrange(k.expires, 0, -1)) == \
        sorted([f"x{long}".encode(), *(f"~{j}".encode() for j in late)])


def test_a_campaign_expires_at_expires_its_jobs(fleet: Fleet) -> None:
    app = fleet.app
    work = app.tasks["work"]
    at = datetime.now(UTC) + timedelta(seconds=0.4)
    with app.campaign("sale", expires_at=at) as c:
        work.options(campaign=c).enqueue_many([(f"s{i}",) for i in range(30)])
    with app.campaign("other") as other:
        work.options(campaign=other).enqueue_many([(f"o{i}",) for i in range(5)])
    time.sleep(0.6)
    fleet.drain("-c", "4")
    assert {r.token for r in fleet.runs()} == {f"o{i}" for i in range(5)}
    st = c.stats()
    assert (st.total, st.expired, st.succeeded, st.pending) == (30, 30, 0, 0), st
    fleet.until(lambda: c.stats().done, 20, "the expired campaign completes")
    assert c.stats().expired == 30  # kept in the final record
    assert (other.stats().succeeded, other.stats().expired) == (5, 0)
    with pytest.raises(ValueError, match="expires_at"):
        app.campaign("past", expires_at=time.time() - 1)


def test_a_delayed_job_expiring_while_delayed_never_runs(fleet: Fleet) -> None:
    app = fleet.app
    work = app.tasks["work"]
    gone = work.options(delay_s=0.6, expires_s=0.2).enqueue("late")
    work.options(delay_s=0.6, expires_s=30).enqueue("due")
    sup = fleet.start("-c", "4")
    fleet.wait_completed(["due"], 20)
    q = app.queue("default")
    fleet.until(lambda: q.stats().expired == 1 and q.stats().pending == 0, 10, "dropped")
    sup.stop()
    assert [r.token for r in fleet.runs()] == ["due"]
    assert app.job_status(gone) != "succeeded"


def test_an_expired_grouped_job_frees_its_quota_and_takes_no_token(fleet: Fleet) -> None:
    app = fleet.app
    q = app.queue("default")
    q.limit(group="acme", max_pending=3, rate_per_s=0.1, burst=1)
    acme = app.tasks["work"].options(group="acme")
    acme.options(expires_s=0.2).enqueue_many([("g0",), ("g1",), ("g2",)])
    with pytest.raises(batchq.QuotaExceeded):
        acme.enqueue("over")
    time.sleep(0.4)
    # one pop drops the three (their places are given back) and leases nothing
    k = app.keys("default")
    got = decode_pop_reply(app.sync_scripts.call(calls.pop(k, 10, 30_000, 100)))
    assert len(got.jobs) == 0
    assert q.stats().expired == 3
    acme.enqueue_many([("n0",), ("n1",), ("n2",)])  # the quota is free again
    # the group's only token was not spent on the expired ones: n0 starts at once
    got = decode_pop_reply(app.sync_scripts.call(calls.pop(k, 10, 30_000, 100)))
    assert len(got.jobs) == 1


def test_a_retry_past_the_deadline_expires_instead_of_running(fleet: Fleet) -> None:
    app = fleet.app
    k = app.keys("default")
    jid = app.tasks["work"].options(expires_s=0.3).enqueue("retry-me")
    got = decode_pop_reply(app.sync_scripts.call(calls.pop(k, 1, 30_000, 100)))
    assert len(got.jobs) == 1
    time.sleep(0.5)  # its deadline passes while it runs
    lease = f"{jid}:1"
    app.sync_scripts.call(calls.nack(k, [(lease, 0, "boom")], []))
    time.sleep(0.05)
    again = decode_pop_reply(app.sync_scripts.call(calls.pop(k, 1, 30_000, 100)))
    assert len(again.jobs) == 0
    st = app.queue("default").stats()
    assert (st.expired, st.pending) == (1, 0), st


def test_bad_expiry_is_refused_and_writes_nothing(fleet: Fleet) -> None:
    app = fleet.app
    work = app.tasks["work"]
    for kw, msg in (({"expires_s": 0}, "expires_s"), ({"expires_s": -1}, "expires_s"),
                    ({"expires_at": time.time() - 5}, "expires_at .* in the past"),
                    ({"expires_s": 5, "expires_at": time.time() + 60}, "not both"),
                    ({"keep_expired": True}, "keep_expired needs")):
        with pytest.raises(ValueError, match=msg):
            work.options(**kw).enqueue("never")
    with pytest.raises(TypeError, match="expires_at"):
        work.options(expires_at="tomorrow").enqueue("never")
    assert app.queue("default").stats().pending == 0
    assert not fleet.r.exists(app.keys("default").stats)
