"""Campaign and keyed (tracked, "_m") jobs under results/status/cancel: their ids
carry a sequence number then the mark, enqueue_tracked.lua sets their waiting bits, and a
cancel settles them in their campaign exactly once."""

from __future__ import annotations

import pytest
import redis
from fixtures.campaigns import *  # noqa: F403

import batchq
from batchq.store import codec
from batchq.store.keys import QueueKeys

pytestmark = pytest.mark.integration


def test_campaign_job_ids_carry_the_sequence_then_the_mark(app):
    send = app.tasks["send"]
    c = app.campaign("ids")
    ready = send.options(campaign=c).enqueue(1)
    many = send.options(campaign=c).enqueue_many([(i,) for i in range(2, 12)])
    keyed = send.options(key="ids:k").enqueue(12)
    delayed = send.options(campaign=c, delay_s=3600).enqueue(13)
    for jid in (ready, *many, keyed):
        assert jid.endswith("_m") and codec.seq_of(jid) is not None, jid
        assert codec.ref_of(jid) == codec.queue_ref("a")
        assert app.job_status(jid) == "ready", jid
    assert delayed.endswith("_m") and codec.seq_of(delayed) is None
    assert app.job_status(delayed) == "delayed"
    seqs = [codec.seq_of(j) for j in many]
    assert len(set(seqs)) == len(seqs)


def test_cancelled_campaign_jobs_never_run_and_count_once(app, drain,
                                                          redis_client: redis.Redis,
                                                          namespace: str):
    send = app.tasks["send"]
    c = app.campaign("cancel-some")
    ids = send.options(campaign=c).enqueue_many([(i,) for i in range(10)])
    later = send.options(campaign=c, delay_s=3600).enqueue(99)
    assert app.cancel(ids[3]) is True
    assert app.cancel(ids[3]) is False  # once
    assert app.job_status(ids[3]) == "cancelled"
    assert app.cancel(later) is True  # delayed: settled at once
    s = c.stats()
    # the delayed one counts at once; the ready one when a worker pops and drops it
    assert (s.total, s.pending, s.cancelled) == (11, 10, 1)
    drain("a")
    ran = sorted(int(x) for x in redis_client.lrange(f"{namespace}:ran", 0, -1))
    assert ran == [i for i in range(10) if i != 3]
    s = c.stats()
    assert (s.total, s.succeeded, s.cancelled, s.pending) == (11, 9, 2, 0)
    assert app.job_status(ids[3]) == "cancelled" and app.job_status(later) == "cancelled"
    assert app.cancel(ids[0]) is False  # ran
    k = QueueKeys(namespace, "a")
    assert redis_client.hlen(k.jobmeta) == 0 and redis_client.hlen(k.cancel) == 0
    assert redis_client.hlen(k.pending) == 0
    assert all(redis_client.bitcount(w) == 0
               for w in (k.waiting0, k.waiting1, k.waiting2, k.waiting3))


def test_a_cancelled_keyed_job_releases_nothing_early(app, drain, redis_client: redis.Redis,
                                                      namespace: str):
    send = app.tasks["send"]
    jid = send.options(key="k1").enqueue(1)
    assert app.cancel(jid) is True
    drain("a")
    assert redis_client.llen(f"{namespace}:ran") == 0
    # the key was settled (its lapse started): still held by the cancelled job meanwhile
    assert send.options(key="k1").enqueue(2) == jid
    assert redis_client.hlen(QueueKeys(namespace, "a").jobmeta) == 0


def test_campaign_job_with_a_kept_result(app, drain):
    @app.task(queue="a", result_ttl_s=60)
    def square(n: int) -> int:
        return n * n

    c = app.campaign("results")
    jid = square.options(campaign=c).enqueue(7)
    drain("a")
    assert app.result(jid, timeout_s=5) == 49
    assert app.job_status(jid) == "succeeded"
    s = c.stats()
    assert (s.total, s.succeeded, s.pending) == (1, 1, 0)


def test_job_cancelled_error_for_a_campaign_job(app):
    c = app.campaign("waits")
    jid = app.tasks["send"].options(campaign=c).enqueue(1)
    assert app.cancel(jid)
    try:
        app.result(jid, timeout_s=2)
    except batchq.JobCancelled as exc:
        assert jid in str(exc)
    else:
        raise AssertionError("JobCancelled expected")
