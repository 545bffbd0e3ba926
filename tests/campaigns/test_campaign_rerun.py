"""A campaign's producer run again after the campaign finished: when every row has a
dedup key and every key is still held, the call writes nothing and returns the holders'
ids (no ``CampaignClosed``); a row with a new key, or without one, still raises
``CampaignClosed`` and writes nothing. Through ``enqueue``, ``enqueue_many`` (one chunk,
and several: the pipelined windows) and their asyncio twins."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import redis
from fixtures.campaigns import *  # noqa: F403

import batchq
from batchq.produce.chunks import CHUNK

pytestmark = pytest.mark.integration


def key(row: tuple[Any, ...]) -> str:
    return f"rerun:{row[0]}"


def _state(app: batchq.App, r: redis.Redis) -> tuple[Any, ...]:
    k = app.keys("a")
    st = app.queue("a").stats()
    return (st.ready, st.delayed, r.hget(k.stats, "enqueued"), r.hlen(k.dedup),
            r.hlen(k.jobmeta))


def _finished(app: batchq.App, drain: Any, cid: str, rows: list[tuple[int]]) -> list[str]:
    send = app.tasks["send"]
    with app.campaign(cid) as c:
        ids = send.options(campaign=c).enqueue_many(rows, key_fn=key)
    drain("a")
    assert c.stats().done and c.stats().state == "done"
    return ids


def test_rerun_of_a_finished_campaign_returns_the_holders(app, drain, redis_client):
    rows = [(i,) for i in range(50)]
    first = _finished(app, drain, "spring", rows)
    before = _state(app, redis_client)
    stats_before = app.campaign("spring").stats()

    with app.campaign("spring") as c:  # the producer, run again as it was written
        again = app.tasks["send"].options(campaign=c).enqueue_many(rows, key_fn=key)
    assert again == first
    one = app.tasks["send"].options(campaign="spring", key="rerun:7").enqueue(7)
    assert one == first[7]
    assert _state(app, redis_client) == before  # nothing written
    after = c.stats()
    assert (after.total, after.succeeded, after.state) == (stats_before.total,
                                                           stats_before.succeeded, "done")


def test_a_new_key_or_no_key_still_raises(app, drain, redis_client):
    rows = [(i,) for i in range(20)]
    _finished(app, drain, "closed", rows)
    before = _state(app, redis_client)
    send = app.tasks["send"].options(campaign="closed")
    with pytest.raises(batchq.CampaignClosed):
        send.enqueue_many([*rows, (99,)], key_fn=key)  # one new key
    with pytest.raises(batchq.CampaignClosed):
        send.enqueue_many(rows, key_fn=lambda r: None if r[0] == 3 else key(r))
    with pytest.raises(batchq.CampaignClosed):
        send.options(key="rerun:new").enqueue(1)
    with pytest.raises(batchq.CampaignClosed):
        send.enqueue(1)  # no key at all
    assert _state(app, redis_client) == before


def test_rerun_across_several_chunks(app, drain, redis_client):
    """More rows than one script call takes: the later chunks go pipelined, and a
    closed campaign is judged per chunk by the script, never by the join alone."""
    rows = [(i,) for i in range(2 * CHUNK + 300)]
    first = _finished(app, drain, "big", rows)
    before = _state(app, redis_client)
    send = app.tasks["send"].options(campaign="big")
    assert send.enqueue_many(rows, key_fn=key) == first
    with pytest.raises(batchq.CampaignClosed):  # a new key in the last chunk only
        send.enqueue_many([*rows, (10**6,)], key_fn=key)
    assert _state(app, redis_client) == before


def test_rerun_async(app, drain, redis_client):
    rows = [(i,) for i in range(CHUNK + 10)]
    first = _finished(app, drain, "asy", rows)
    before = _state(app, redis_client)
    send = app.tasks["send"].options(campaign="asy")

    async def go() -> tuple[list[str], str]:
        many = await send.aenqueue_many(rows, key_fn=key)
        one = await send.options(key="rerun:3").aenqueue(3)
        with pytest.raises(batchq.CampaignClosed):
            await send.aenqueue_many([*rows, (10**6,)], key_fn=key)
        with pytest.raises(batchq.CampaignClosed):
            await send.options(key="rerun:fresh").aenqueue(1)
        await app.clients.aclose()
        return many, one

    many, one = asyncio.run(go())
    assert many == first and one == first[3]
    assert _state(app, redis_client) == before


def test_a_lapsed_key_is_not_held(app, drain, redis_client):
    """After key_ttl_s the key is free again: a rerun would write, so it is refused."""
    send = app.tasks["send"].options(key_ttl_s=0.2)
    with app.campaign("short") as c:
        send.options(campaign=c).enqueue_many([(1,), (2,)], key_fn=key)
    drain("a")
    assert c.stats().done
    import time
    time.sleep(0.5)
    with pytest.raises(batchq.CampaignClosed):
        send.options(campaign="short").enqueue_many([(1,), (2,)], key_fn=key)
