"""periodic_tick.lua: one enqueue per (schedule, tick), ticks only move forward, missed
ticks are skipped (or run once with catch-up), never early by the server's clock."""

from __future__ import annotations

import pytest
import redis
from fixtures.lua import enqueued, entry, server_ms
from fixtures.scripts import *  # noqa: F403

from batchq.store.keys import QueueKeys
from batchq.store.scripts import SyncScripts, calls

pytestmark = pytest.mark.script

GRACE_MS = 15_000


def tick(r: redis.Redis, k: QueueKeys, t: int, nxt: int, *, grace: int = GRACE_MS,
         catch_up: bool = False, e: bytes | None = None, name: str = "sweep") -> list[int]:
    res = SyncScripts(r).call(calls.periodic_tick(
        k, 0, name, t, nxt, grace, catch_up, e or entry(f"j{t}", task=name), "every 1s",
        "batchq.produce.periodic.abc"))
    return [int(x) for x in res]


def state(r: redis.Redis, k: QueueKeys, name: str = "sweep") -> dict[str, int | str]:
    raw = r.hgetall(k.periodic)
    return {f.decode().split(":")[1]: int(v) if v.isdigit() else v.decode()
            for f, v in raw.items() if f.decode().startswith(name + ":")}


def test_a_tick_is_enqueued_once_and_recorded(redis_client, k):
    now = server_ms(redis_client)
    t = now - now % 1000
    code, at = tick(redis_client, k, t, t + 1000)
    assert code == 1 and at >= now
    assert redis_client.lrange(k.ready_for(0), 0, -1) == [entry(f"j{t}", task="sweep")]
    assert redis_client.llen(k.wake) == 1
    assert enqueued(redis_client, k) == 1
    assert state(redis_client, k) == {"tick": t, "run": at, "next": t + 1000,
                                      "schedule": "every 1s", "lock": "batchq.produce.periodic.abc"}

    # a second scheduler with the same tick (another job id): refused
    assert tick(redis_client, k, t, t + 1000, e=entry("other", task="sweep")) == [0, t]
    # an older tick after a newer one: refused, ticks only move forward
    assert tick(redis_client, k, t - 1000, t)[0] == 0
    assert redis_client.llen(k.ready_for(0)) == 1
    assert enqueued(redis_client, k) == 1


def test_schedules_are_guarded_separately(redis_client, k):
    now = server_ms(redis_client)
    assert tick(redis_client, k, now, now + 1000, name="a")[0] == 1
    assert tick(redis_client, k, now, now + 1000, name="b")[0] == 1
    assert redis_client.llen(k.ready_for(0)) == 2


def test_a_tick_in_the_future_of_the_server_clock_waits(redis_client, k):
    now = server_ms(redis_client)
    code, wait_ms = tick(redis_client, k, now + 60_000, now + 120_000)
    assert code == -1 and 50_000 < wait_ms <= 60_000
    assert redis_client.llen(k.ready_for(0)) == 0
    assert redis_client.exists(k.periodic) == 0


def test_a_late_tick_within_the_grace_still_runs(redis_client, k):
    now = server_ms(redis_client)
    assert tick(redis_client, k, now - 10_000, now + 50_000)[0] == 1


def test_a_missed_tick_is_skipped_without_catch_up(redis_client, k):
    now = server_ms(redis_client)
    redis_client.hset(k.periodic, "sweep:tick", now - 3_600_000)  # ran an hour ago
    code, _ = tick(redis_client, k, now - 60_000, now + 60_000)
    assert code == 2
    assert redis_client.llen(k.ready_for(0)) == 0
    assert state(redis_client, k) == {"tick": now - 3_600_000, "next": now + 60_000,
                                      "schedule": "every 1s", "lock": "batchq.produce.periodic.abc"}


def test_a_missed_tick_runs_once_with_catch_up(redis_client, k):
    now = server_ms(redis_client)
    redis_client.hset(k.periodic, "sweep:tick", now - 3_600_000)
    assert tick(redis_client, k, now - 60_000, now + 60_000, catch_up=True)[0] == 1
    assert tick(redis_client, k, now - 60_000, now + 60_000, catch_up=True)[0] == 0
    assert redis_client.llen(k.ready_for(0)) == 1


def test_catch_up_never_runs_a_schedule_that_never_ran(redis_client, k):
    # a schedule deployed after its latest tick: nothing was missed, it waits for the next
    now = server_ms(redis_client)
    assert tick(redis_client, k, now - 60_000, now + 60_000, catch_up=True)[0] == 2
    assert redis_client.llen(k.ready_for(0)) == 0
