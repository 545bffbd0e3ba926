"""A sealed campaign drained by a worker whose pops lease its jobs in bundles: it
completes once, with exact counts (succeeded, dead after retries, dedup-keyed jobs)."""

from __future__ import annotations

import pytest
import redis
from fixtures.campaigns import *  # noqa: F403
from fixtures.campaigns import completions

pytestmark = pytest.mark.integration


def test_a_sealed_campaign_drained_in_bundles_completes_with_exact_counts(
        app, drain, redis_client: redis.Redis, namespace):
    send, report = app.tasks["send"], app.tasks["report"]
    k = app.keys("a")
    with app.campaign("bundled", on_complete=report) as c:
        send.options(campaign=c).enqueue_many([(i,) for i in range(500)])
        send.options(campaign=c).enqueue_many([(i, True) for i in range(500, 505)])
    keyed = [send.options(key=f"k{i}").enqueue(2000 + i) for i in range(50)]
    assert c.stats().state == "sealed"
    drain("a")
    # only tracked jobs were there: the pops made bundles of them
    assert int(redis_client.hget(k.stats, "bseq") or 0) > 0
    st = c.stats()
    assert st.done and st.state == "done"
    assert (st.total, st.succeeded, st.dead, st.cancelled, st.pending) == (505, 500, 5, 0, 0)
    assert redis_client.hlen(k.jobmeta) == 0 and not redis_client.exists(k.bundles)
    assert int(redis_client.hget(k.stats, "bundled") or 0) == 0
    # every dedup key lapses from its job's settle on, and still names its job
    assert redis_client.zcard(k.dedup_exp) == 50
    assert [send.options(key=f"k{i}").enqueue(0) for i in range(50)] == keyed
    drain("cb")
    done = completions(redis_client, namespace)
    assert [(cid, s["total"], s["succeeded"], s["dead"]) for cid, s in done] == \
        [("bundled", 505, 500, 5)]
    # each failing job ran twice (max_attempts=2), every other once
    assert redis_client.llen(f"{namespace}:ran") == 500 + 5 * 2 + 50
