"""Campaigns end to end in one process: counts, seal, completion once, cancel, closed."""

from __future__ import annotations

import asyncio

import pytest
import redis
from fixtures.campaigns import *  # noqa: F403
from fixtures.campaigns import completions

import batchq

pytestmark = pytest.mark.integration


def test_campaign_counts_and_completes_once(app, drain, redis_client: redis.Redis, namespace):
    send, other, report = app.tasks["send"], app.tasks["other"], app.tasks["report"]
    with app.campaign("spring", on_complete=report) as c:
        send.options(campaign=c).enqueue_many([(i,) for i in range(50)])
        send.options(campaign=c).enqueue_many([(i, True) for i in range(50, 53)])
        other.options(campaign="spring").enqueue_many(range(100, 110))
        s = c.stats()
        assert (s.total, s.pending, s.state) == (63, 63, "open")
    assert c.stats().state == "sealed"
    drain("a", "b")
    st = c.stats()
    assert st.done and st.state == "done"
    assert (st.total, st.succeeded, st.dead, st.cancelled, st.pending) == (63, 60, 3, 0, 0)
    drain("cb")
    done = completions(redis_client, namespace)
    assert len(done) == 1
    cid, stats = done[0]
    assert cid == "spring" and stats["total"] == 63 and stats["dead"] == 3
    # every way of trying again is harmless
    assert batchq.produce.campaign.try_complete(app.clients, "spring") is False
    c.seal()
    drain("cb")
    assert len(completions(redis_client, namespace)) == 1
    # a job retried once (max_attempts=2) ran twice and counted once
    assert redis_client.llen(f"{namespace}:ran") == 50 + 3 * 2 + 10


def test_empty_sealed_campaign_completes_at_once(app, drain, redis_client, namespace):
    c = app.campaign(on_complete=app.tasks["report"])
    c.seal()
    assert c.stats().done
    drain("cb")
    assert [cid for cid, _ in completions(redis_client, namespace)] == [c.id]


def test_sealed_or_cancelled_campaign_refuses_jobs(app):
    send = app.tasks["send"]
    c = app.campaign("closed-one")
    send.options(campaign=c).enqueue(1)
    c.seal()
    with pytest.raises(batchq.CampaignClosed):
        send.options(campaign=c).enqueue(2)
    with pytest.raises(batchq.CampaignClosed):  # a queue it never used
        app.tasks["other"].options(campaign=c).enqueue(2)
    d = app.campaign("cancelled-one")
    d.cancel()
    with pytest.raises(batchq.CampaignClosed):
        send.options(campaign=d).enqueue_many([1, 2])
    with pytest.raises(batchq.CampaignNotFound, match="no-such"):
        send.options(campaign="no-such").enqueue(1)
    with pytest.raises(ValueError, match="campaign id"):
        send.options(campaign="has space")
    with pytest.raises(batchq.CampaignNotFound):
        batchq.Campaign(app.clients, "nope").stats()


def test_cancel_skips_jobs_not_started(app, drain, redis_client, namespace):
    send, report = app.tasks["send"], app.tasks["report"]
    c = app.campaign("stop-it", on_complete=report)
    send.options(campaign=c).enqueue_many(range(30))
    send.options(campaign=c, delay_s=0.01).enqueue_many(range(30, 40))
    assert c.cancel() == 40
    assert c.stats().state == "cancelled"
    drain("a")
    assert redis_client.llen(f"{namespace}:ran") == 0
    st = c.stats()
    assert (st.total, st.cancelled, st.pending, st.done) == (40, 40, 0, True)
    drain("cb")
    assert completions(redis_client, namespace)[0][1]["cancelled"] == 40


def test_app_campaign_returns_the_existing_one(app):
    c = app.campaign("again", on_complete=app.tasks["report"])
    app.tasks["send"].options(campaign=c).enqueue(1)
    same = app.campaign("again")
    assert same.id == "again" and same.stats().total == 1
    assert "again" in [s.id for s in app.campaigns()]


def test_async_with_seals(app):
    async def produce() -> batchq.Campaign:
        async with app.campaign("async-one") as c:
            await app.tasks["send"].options(campaign=c).aenqueue_many([1, 2, 3])
            await app.tasks["send"].options(campaign=c).aenqueue(4)
        await app.aclose()
        return c

    c = asyncio.run(produce())
    assert c.stats().state == "sealed" and c.stats().total == 4


def test_exception_in_with_does_not_seal(app):
    with pytest.raises(RuntimeError), app.campaign("crashy") as c:
        raise RuntimeError("producer crashed")
    assert c.stats().state == "open"
