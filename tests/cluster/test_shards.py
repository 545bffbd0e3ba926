"""Sharded queues ("one hot queue over several Cluster nodes") on the embedded
Valkey: producers spread chunks over the shards, a group or a dedup key stays in one
shard, workers drain every shard (also shards beyond their own count, after a count
change), and every operator view sees one queue."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator

import pytest
import redis
from fixtures.basic import *  # noqa: F403
from helpers import app_in_namespace, drop_namespace, wait_until

import batchq
from batchq.ops import overview
from batchq.store.keys import shards_key
from batchq.worker import worker as worker_mod

pytestmark = pytest.mark.integration

N_SHARDS = 4


def make_app(url: str, ns: str, shards: int | None = N_SHARDS) -> batchq.App:
    app = batchq.App(url, namespace=ns)

    @app.task(queue="hot", shards=shards, max_attempts=1)
    def send(n: int, fail: bool = False) -> None:
        pipe = app.redis.pipeline(transaction=False)
        pipe.sadd(f"{ns}:ran", n)
        pipe.incr(f"{ns}:runs")
        pipe.execute()
        if fail:
            raise RuntimeError(f"fail {n}")

    return app


@pytest.fixture
def app(redis_url: str, namespace: str, redis_client: redis.Redis) -> Iterator[batchq.App]:
    yield from app_in_namespace(make_app, redis_url, namespace, redis_client)


def drain(app: batchq.App, *queues: str, **kw: object) -> int:
    s = batchq.WorkerSettings(queues=queues or ("hot",), burst=True,
                              install_signal_handlers=False, metrics=False,
                              concurrency=20, **kw)  # type: ignore[arg-type]
    return asyncio.run(batchq.Worker(app, s).run())


def ran(r: redis.Redis, ns: str) -> tuple[int, int]:
    """(distinct jobs run, runs)."""
    return int(r.scard(f"{ns}:ran")), int(r.get(f"{ns}:runs") or 0)


def per_shard(app: batchq.App) -> list[int]:
    return [q.stats().ready for q in app.queue("hot").shards()]


def test_enqueue_many_spreads_chunks_over_the_shards_and_a_drain_runs_each_job_once(
        app, redis_client, namespace):
    ids = app.tasks["send"].enqueue_many(range(5500))
    assert len(set(ids)) == 5500
    counts = per_shard(app)
    assert len(counts) == N_SHARDS
    # whole chunks of 1,000 (the last one 500), one shard per chunk, in turn
    assert sorted(counts) == [1000, 1000, 1500, 2000], counts
    assert redis_client.zscore(shards_key(namespace), "hot") == N_SHARDS
    st = app.queue("hot").stats()
    assert st.ready == 5500
    assert drain(app) == 0
    assert ran(redis_client, namespace) == (5500, 5500)
    assert app.queue("hot").stats().pending == 0


def test_single_enqueues_rotate_over_the_shards(app):
    for i in range(8):
        app.tasks["send"].enqueue(i)
    assert per_shard(app) == [2] * N_SHARDS


def test_aenqueue_many_spreads_too(app, redis_client, namespace):
    async def go() -> list[str]:
        try:
            return await app.tasks["send"].aenqueue_many(range(4000))
        finally:
            await app.aclose()

    ids = asyncio.run(go())
    assert len(set(ids)) == 4000
    assert per_shard(app) == [1000] * N_SHARDS
    assert drain(app) == 0
    assert ran(redis_client, namespace) == (4000, 4000)


def test_a_group_lives_in_one_shard_and_its_limit_is_written_to_every_shard(app):
    send = app.tasks["send"]
    q = app.queue("hot")
    q.limit("tenant-a", concurrency=2)
    for shard in q.shards():
        assert [lim.group for lim in batchq.ops.queue.limits.limits(app.redis, shard.keys)] == \
            ["tenant-a"]
    send.options(group="tenant-a").enqueue_many(range(2500))
    for i in range(10):
        send.options(group="tenant-a").enqueue(10_000 + i)
    grouped = [s.stats().grouped for s in q.shards()]
    assert sorted(grouped) == [0] * (N_SHARDS - 1) + [2510], grouped
    assert q.stats().grouped == 2510
    with pytest.raises(ValueError, match="sharded"):
        q.limit(rate_per_s=10)
    assert q.remove_limit("tenant-a")
    assert q.limits() == []


def test_dedup_keys_go_to_one_shard_and_unsupported_mixes_are_refused(app):
    send = app.tasks["send"]
    first = send.options(key="k1").enqueue(1)
    assert send.options(key="k1").enqueue(2) == first
    with pytest.raises(ValueError, match="key_fn"):
        send.enqueue_many([1, 2], key_fn=str)
    with pytest.raises(ValueError, match="group and a dedup key"):
        send.options(key="k2", group="g").enqueue(3)
    assert app.queue("hot").stats().ready == 1


def test_status_cancel_and_campaigns_follow_a_job_to_its_shard(app, redis_client, namespace):
    send = app.tasks["send"]
    ids = [send.enqueue(i) for i in range(N_SHARDS)]
    assert {app.job_status(i) for i in ids} == {"ready"}
    assert app.cancel(ids[-1])  # on the last shard
    assert app.job_status(ids[-1]) == "cancelled"
    with app.campaign("camp-1") as c:
        send.options(campaign=c).enqueue_many(range(100, 3100))
    assert drain(app) == 0
    assert ran(redis_client, namespace)[0] == N_SHARDS - 1 + 3000
    stats = c.stats()
    assert (stats.total, stats.succeeded, stats.pending) == (3000, 3000, 0)


def test_dead_letters_pause_and_clear_cover_every_shard(app, redis_client, namespace):
    send = app.tasks["send"]
    send.options().enqueue_many([batchq.call(i, fail=True) for i in range(2500)])
    q = app.queue("hot")
    q.pause()
    assert q.is_paused()
    assert drain(app) == 6  # EXIT_STALLED: jobs left only in paused queues
    q.resume()
    assert not q.is_paused()
    assert drain(app) == 0
    assert q.stats().dead == 2500
    assert len(q.dead_ids()) == 2500
    assert len(q.dead_ids(limit=10)) == 10
    dead = q.dead_jobs(limit=5)
    assert len(dead) == 5 and {d.queue for d in dead} == {"hot"}
    assert q.dead_count() == 2500
    newest = q.dead_range(0, 2499)
    assert len(set(newest)) == 2500 and set(newest) == set(q.dead_ids())
    assert q.dead_range(10, 19) == newest[10:20]
    from batchq.web import deadletters
    assert deadletters.page(app, q, 0, 7)["total"] == 2500
    assert len(deadletters.page(app, q, 0, 7)["jobs"]) == 7
    assert q.retry_dead(q.dead_ids(limit=300)) == 300
    assert q.stats().ready == 300
    assert q.purge_dead() == 2200
    assert q.stats().dead == 0
    q.clear()
    assert q.stats().pending == 0


def test_info_reports_a_sharded_queue_as_one_queue(app):
    app.tasks["send"].enqueue_many(range(3000))
    snap = overview.snapshot(app)
    assert list(snap["queues"]) == ["hot"]
    assert snap["queues"]["hot"]["ready"] == 3000
    assert snap["queues"]["hot"]["shards"] == N_SHARDS


def test_a_lowered_shard_count_still_drains_the_old_shards(
        app, redis_url, namespace, redis_client):
    app.tasks["send"].enqueue_many(range(6000))
    # the next deployment runs with 2 shards (and then none): its workers still find
    # the 4 shards the registry knows
    for i, count in enumerate((2, None)):
        later = make_app(redis_url, namespace, shards=count)
        try:
            assert len(later.queue("hot").shards()) == N_SHARDS
            later.tasks["send"].enqueue_many(range(6000 + 1000 * i, 7000 + 1000 * i))
            if count is None:
                assert drain(later) == 0
        finally:
            later.close()
    assert ran(redis_client, namespace) == (8000, 8000)


def test_a_running_worker_picks_up_shards_added_later(
        redis_url, namespace, redis_client, monkeypatch, app):
    monkeypatch.setattr(worker_mod, "SHARDS_EVERY_S", 0.2)
    plain = make_app(redis_url, namespace, shards=None)
    s = batchq.WorkerSettings(queues=("hot",), install_signal_handlers=False,
                              metrics=False, concurrency=10, max_block_s=0.5)
    w = batchq.Worker(plain, s)
    done: list[int] = []
    loop = asyncio.new_event_loop()
    th = threading.Thread(target=lambda: done.append(loop.run_until_complete(w.run())))
    th.start()
    try:
        wait_until(lambda: redis_client.sismember(f"{namespace}:queues", "hot"),
                   timeout_s=10, message="the worker did not start")
        assert len(w.queues) == 1
        app.tasks["send"].enqueue_many(range(4000))  # 4 shards, from another app
        wait_until(lambda: ran(redis_client, namespace)[1] >= 4000, timeout_s=30,
                   message="the new shards were not served")
        assert len(w.queues) == N_SHARDS
    finally:
        loop.call_soon_threadsafe(w.request_stop)
        th.join(30)
        loop.close()
        plain.close()
    assert done == [0]
    assert ran(redis_client, namespace) == (4000, 4000)


def test_shard_names_cannot_be_queue_names(app):
    with pytest.raises(ValueError):
        app.queue("a:s1", shards=2)
    with pytest.raises(ValueError, match="already configured"):
        app.queue("hot", shards=2)
    with pytest.raises(ValueError, match="shards"):
        app.queue("other", shards=0)
    q: Callable[..., object] = app.task(queue="x:s1")
    with pytest.raises(ValueError):
        q(lambda: None)


def test_results_and_metrics_see_one_queue(redis_url, namespace, redis_client):
    from prometheus_client import CollectorRegistry

    from batchq.ops.metrics import QueueCollector

    app = batchq.App(redis_url, namespace=namespace)
    try:
        @app.task(queue="res", shards=3, result_ttl_s=60)
        def double(n: int) -> int:
            return 2 * n

        ids = [double.enqueue(i) for i in range(6)]
        assert len({app.clients.keys(q.name).prefix for q in app.queue("res").shards()}) == 3
        assert drain(app, "res") == 0
        assert [app.result(j, timeout_s=5) for j in ids] == [0, 2, 4, 6, 8, 10]
        reg = CollectorRegistry()
        reg.register(QueueCollector(app))
        labels = {s.labels.get("queue") for m in reg.collect() for s in m.samples
                  if "queue" in s.labels}
        assert labels == {"res"}
        assert reg.get_sample_value("batchq_queue_outcomes_total",
                                    {"queue": "res", "outcome": "succeeded"}) == 6
    finally:
        app.close()
        drop_namespace(redis_client, namespace)


def test_the_flow_view_of_a_sharded_queue_covers_every_shard(app: batchq.App,
                                                              redis_client: redis.Redis) -> None:
    """``batchq info`` / ``/api/info``, ``batchq limit list`` and the limit gauges read
    the flow of every shard: groups that wait in shard 2 and shard 3 are both listed,
    and a limit's pending count is the sum over the shards."""
    from batchq.flow import view as flow_view
    from batchq.store import shards

    by_shard: dict[int, str] = {}
    for i in range(200):
        by_shard.setdefault(shards.stable(f"g{i}", N_SHARDS), f"g{i}")
    a, b = by_shard[2], by_shard[3]  # two groups that live in two other shards than 0
    q = app.queue("hot")
    q.limit(group=a, rate_per_s=5)
    q.limit(group=b, rate_per_s=5)
    send = app.tasks["send"]
    send.options(group=a).enqueue_many(range(3))
    send.options(group=b).enqueue_many(range(3, 8))
    q.hold(600, group=a)
    q.hold(300, group=b)

    snap = overview.snapshot(app)
    flow = snap["queues"]["hot"]["flow"]
    waiting = {w["group"]: w for w in flow["waiting_groups"]}
    assert set(waiting) == {a, b}
    assert [w["group"] for w in flow["waiting_groups"]] == [a, b]  # longest hold first
    assert waiting[a]["state"] == waiting[b]["state"] == "waiting"
    limits = {row["group"]: row for row in flow["limits"]}
    assert limits[a]["pending"] == 3 and limits[b]["pending"] == 5
    assert limits[a]["state"] == "waiting" and 590 < limits[a]["until_s"] <= 600

    # the same merge behind the limit gauges and `batchq limit list`
    keys = {"hot": [s.keys for s in q.shards()]}
    merged = flow_view.read_shards(app.redis, keys)["hot"]
    assert {g.group for g in merged.waiting} == {a, b}
    assert flow_view.read_shards(app.redis, keys, groups=1)["hot"].waiting[0].group == a
