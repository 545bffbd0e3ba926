"""Dedup keys: one job per key while it is pending, running, or finished less than
key_ttl_s ago; racing producers; reruns of a campaign after a crash."""

from __future__ import annotations

import multiprocessing
import time

import pytest
import redis
from fixtures.campaigns import *  # noqa: F403
from fixtures.campaigns import make_app

import batchq

pytestmark = pytest.mark.integration

KEYS = 2000


def test_second_enqueue_with_a_held_key_returns_the_first_id(app, drain, redis_client,
                                                             namespace):
    send = app.tasks["send"]
    first = send.options(key="ann@example.com").enqueue(1)
    assert first.endswith("_m")
    assert send.options(key="ann@example.com").enqueue(2) == first
    q = app.queue("a")
    assert q.stats().ready == 1
    drain("a")
    # finished less than key_ttl_s ago: still held
    assert send.options(key="ann@example.com").enqueue(3) == first
    assert redis_client.lrange(f"{namespace}:ran", 0, -1) == [b"1"]
    assert redis_client.hlen(app.keys("a").jobmeta) == 0


def test_key_is_free_again_after_key_ttl(app, drain, redis_client, namespace):
    send = app.tasks["send"]
    first = send.options(key="k", key_ttl_s=0.2).enqueue(1)
    drain("a")
    time.sleep(0.3)
    again = send.options(key="k").enqueue(2)
    assert again != first
    drain("a")
    assert redis_client.lrange(f"{namespace}:ran", 0, -1) == [b"1", b"2"]


def test_dead_job_releases_its_key_after_the_ttl_too(app, drain):
    send = app.tasks["send"]
    first = send.options(key="d", key_ttl_s=2.0).enqueue(1, True)
    drain("a")
    assert app.queue("a").stats().dead == 1
    assert send.options(key="d").enqueue(2) == first  # held right after dying
    time.sleep(2.1)
    assert send.options(key="d").enqueue(3) != first


def test_enqueue_many_with_key_fn(app, redis_client):
    send = app.tasks["send"]
    rows = [(i,) for i in range(10)] + [(3,), (4,)]  # repeated keys within one call
    ids = send.enqueue_many(rows, key_fn=lambda row: f"row:{row[0]}")
    assert len(ids) == 12 and ids[10] == ids[3] and ids[11] == ids[4]
    assert app.queue("a").stats().ready == 10
    again = send.enqueue_many([(i,) for i in range(12)], key_fn=lambda row: f"row:{row[0]}")
    assert again[:10] == ids[:10]
    assert app.queue("a").stats().ready == 12
    # None: no key for that row
    send.enqueue_many([(1,), (1,)], key_fn=lambda row: None)
    assert app.queue("a").stats().ready == 14


def test_enqueue_many_over_several_windows_keeps_order_and_exact_counts(app, redis_client):
    # 8 chunks of 1,000 per window; the next window encodes while the previous one is on
    # the wire: the ids still come back in row order, and an item that cannot be encoded
    # reports exactly the jobs of the windows before it
    send = app.tasks["send"]
    n = 19_500
    ids = send.enqueue_many(range(n), key_fn=lambda i: f"w:{i}")
    assert len(set(ids)) == n and app.queue("a").stats().ready == n
    again = send.enqueue_many(range(n), key_fn=lambda i: f"w:{i}")
    assert again == ids
    rows: list[object] = list(range(n, n + 17_000))
    rows[16_500] = ({(1,): 0},)  # the third window's first chunk holds it
    with pytest.raises(TypeError, match="item 16500") as err:
        send.enqueue_many(rows, key_fn=lambda i: f"w:{i}" if isinstance(i, int) else "x")
    assert getattr(err.value, "written", None) == 16_000
    assert len(getattr(err.value, "ids", [])) == 16_000
    assert app.queue("a").stats().ready == n + 16_000


def test_bad_keys_are_refused(app):
    send = app.tasks["send"]
    with pytest.raises(ValueError, match="512"):
        send.options(key="x" * 513)
    send.options(key="x" * 512)  # the limit itself is fine
    with pytest.raises(ValueError, match="512"):
        send.enqueue_many([1], key_fn=lambda row: "é" * 257)  # 514 bytes
    with pytest.raises(TypeError, match="dedup key must be a str"):
        send.enqueue_many([1], key_fn=lambda row: 7)
    with pytest.raises(ValueError, match="key_fn"):
        send.options(key="one").enqueue_many([1, 2])
    with pytest.raises(ValueError, match=r"1\.\.512"):
        send.options(key="")
    assert app.queue("a").stats().ready == 0


def _produce(url: str, ns: str, start: multiprocessing.synchronize.Event,
             out: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    app = make_app(url, ns)
    start.wait()
    ids = app.tasks["send"].enqueue_many([(i,) for i in range(KEYS)],
                                         key_fn=lambda row: f"race:{row[0]}")
    out.put(ids)


def test_eight_racing_producers_write_one_job_per_key(app, redis_url, namespace,
                                                      redis_client: redis.Redis):
    ctx = multiprocessing.get_context("spawn")
    start, out = ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=_produce, args=(redis_url, namespace, start, out))
             for _ in range(8)]
    for p in procs:
        p.start()
    start.set()
    results = [out.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(30)
        assert p.exitcode == 0
    assert app.queue("a").stats().ready == KEYS
    assert redis_client.hlen(app.keys("a").dedup) == KEYS
    # every producer got the same id for each key: the one job holding it
    assert all(r == results[0] for r in results)
    assert len(set(results[0])) == KEYS


def test_rerun_of_a_crashed_campaign_producer_adds_only_what_is_missing(app, drain):
    send = app.tasks["send"]
    rows = [(i,) for i in range(100)]

    def key(row: tuple[int]) -> str:
        return f"rerun:{row[0]}"

    c = app.campaign("rerun")
    first = send.options(campaign=c).enqueue_many(rows[:60], key_fn=key)  # then a crash
    drain("a")
    c = app.campaign("rerun")  # the rerun finds the campaign open
    ids = send.options(campaign=c).enqueue_many(rows, key_fn=key)
    c.seal()
    assert ids[:60] == first
    s = c.stats()
    assert (s.total, s.succeeded, s.pending) == (100, 60, 40)
    drain("a")
    assert c.stats().done and c.stats().succeeded == 100
    # run again after it finished: every key held, nothing to write, the holders' ids
    assert send.options(campaign=c).enqueue_many(rows, key_fn=key) == ids
    with pytest.raises(batchq.CampaignClosed):  # a row that would be written
        send.options(campaign=c).enqueue_many([*rows, (100,)], key_fn=key)
