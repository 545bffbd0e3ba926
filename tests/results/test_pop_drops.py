"""pop.lua and cancelled jobs: a dropped job counts against nothing (the pop's ``want``,
a rate token, a concurrency slot, a quota), the pop reads on in its place up to its drop
budget (ARGV[7]), and a pop that dropped jobs and came back short leaves a wake token."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis
from fixtures.scripts import *  # noqa: F403

import batchq
from batchq.flow.limits import group_hex
from batchq.store.scripts import calls
from batchq.store.scripts.replies import decode_pop_reply

pytestmark = pytest.mark.script


@pytest.fixture
def app(redis_url: str, namespace: str) -> Iterator[batchq.App]:
    a = batchq.App(redis_url, namespace=namespace)

    @a.task(queue="q")
    def work(n: int) -> None: ...

    yield a
    a.close()


def pop(app: batchq.App, want: int, drop: int = 1000) -> list[bytes]:
    res = app.sync_scripts.call(calls.pop(app.keys("q"), want, 30_000, 100, drop=drop))
    return decode_pop_reply(res).jobs


def ids_of(jobs: list[bytes]) -> list[str]:
    return [j.split(b":", 4)[3].decode() for j in jobs]


def test_dropped_jobs_take_no_rate_token(app: batchq.App, redis_client: redis.Redis) -> None:
    app.queue("q").limit(group="g", rate_per_s=1, burst=5)
    work = app.tasks["work"].options(group="g")
    ids = work.enqueue_many([(i,) for i in range(100)])
    assert all(app.cancel(j) for j in ids[:95])
    # the five tokens of the burst go to the five live jobs, behind 95 dropped ones
    assert ids_of(pop(app, 10)) == ids[95:]
    k = app.keys("q")
    assert int(redis_client.hget(k.stats, "cancelled") or 0) == 95
    # the quota counts the five running jobs: the cancels gave the others back
    assert redis_client.hget(k.gstate, f"{group_hex('g')}:n") == b"5"


def test_dropped_jobs_take_no_concurrency_slot(app: batchq.App) -> None:
    app.queue("q").limit(group="g", concurrency=2)
    c = app.campaign("gone")
    work = app.tasks["work"].options(group="g")
    work.options(campaign=c).enqueue_many([(i,) for i in range(50)])
    live = work.enqueue_many([(i,) for i in range(50, 55)])
    c.cancel()
    assert ids_of(pop(app, 10)) == live[:2]  # two slots, two live jobs
    assert pop(app, 10) == []  # both slots held
    assert c.stats().cancelled == 50


def test_the_drop_budget_bounds_a_call_and_leaves_a_wake_token(
        app: batchq.App, redis_client: redis.Redis) -> None:
    work = app.tasks["work"]
    ids = work.enqueue_many([(i,) for i in range(50)])
    assert all(app.cancel(j) for j in ids[:40])
    k = app.keys("q")
    redis_client.delete(k.wake)
    assert pop(app, 5, drop=10) == []  # 10 dropped: the budget spent, none live yet
    assert int(redis_client.hget(k.stats, "cancelled") or 0) == 10
    assert redis_client.lrange(k.wake, 0, -1) == [b"1"]  # pop again at once
    redis_client.delete(k.wake)
    assert ids_of(pop(app, 5)) == ids[40:45]  # the other 30 dropped on the way
    assert int(redis_client.hget(k.stats, "cancelled") or 0) == 40
    assert ids_of(pop(app, 10)) == ids[45:]
    assert redis_client.hlen(k.cancel) == 0
