"""Periodic jobs on the real server: scheduler processes that each tick is enqueued
exactly once by, a leader that is paused or SIGKILLed and replaced within one lease,
no storm after downtime (skip, or one catch-up run), two leaders at once, the status
reader, and an app without periodic tasks costing nothing."""

from __future__ import annotations

import asyncio
import itertools
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
import redis
from apps.periodic_child import build
from fixtures.basic import *  # noqa: F403
from helpers import REPO_ROOT, cli_env, script_calls, wait_until

import batchq
from batchq.produce.periodic import Scheduler, leader_lock_name, periodic_metrics, schedules
from batchq.store import codec
from batchq.store.keys import lock_keys
from batchq.tasks.lock import holder, token_owner

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]

LEASE_S = 1.5


@pytest.fixture
def app(redis_url: str, namespace: str, redis_client: redis.Redis) -> Iterator[batchq.App]:
    a = batchq.App(redis_url, namespace)
    yield a
    a.close()
    keys = list(redis_client.scan_iter(match=f"{namespace}*", count=1000))
    if keys:
        redis_client.delete(*keys)


def ticks(app: batchq.App, queue: str) -> list[int]:
    """The tick (due time, ms) of every job in the queue's ready list, in list order."""
    raw = app.redis.lrange(app.keys(queue).ready_for(0), 0, -1)
    return [codec.decode_entry(e, queue).ready_ms for e in raw]


def server_ms(r: redis.Redis) -> int:
    sec, usec = r.time()
    return int(sec) * 1000 + int(usec) // 1000


def leader_pid(app: batchq.App) -> int | None:
    owner = token_owner(holder(app.clients, leader_lock_name(app)))
    return None if owner is None else int(owner.rsplit(":", 1)[1])


def assert_once_each(ts: list[int], max_gap_ms: int = 1000) -> None:
    assert len(set(ts)) == len(ts), f"a tick was enqueued twice: {ts}"
    assert ts == sorted(ts), ts
    assert all(t % 1000 == 0 for t in ts)
    gaps = [b - a for a, b in itertools.pairwise(ts)]
    assert max(gaps, default=1000) <= max_gap_ms, gaps


# --- several processes --------------------------------------------------------------------


@pytest.fixture
def schedulers(redis_url: str, namespace: str, queue_name: str
               ) -> Iterator[Callable[[int], list[subprocess.Popen[str]]]]:
    procs: list[subprocess.Popen[str]] = []

    def start(n: int) -> list[subprocess.Popen[str]]:
        new = [subprocess.Popen(
            [sys.executable, "-m", "apps.periodic_child", redis_url, namespace,
             queue_name, str(LEASE_S)], cwd=REPO_ROOT, env=cli_env(),
            stdout=subprocess.PIPE, text=True) for _ in range(n)]
        for p in new:
            assert p.stdout is not None and p.stdout.readline().strip() == "ready"
        procs.extend(new)
        return new

    yield start
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.wait(10)
        if p.stdout:
            p.stdout.close()


def test_each_tick_once_across_processes_with_a_paused_and_a_killed_leader(
        app, redis_url, queue_name, schedulers):
    procs = schedulers(3)
    probe = build(redis_url, app.namespace, queue_name)  # the children's tasks: their lock
    pids = {p.pid for p in procs}
    by_pid = {p.pid: p for p in procs}
    r = app.redis

    def wait_ticks(n: int) -> None:
        wait_until(lambda: len(ticks(app, queue_name)) >= n, timeout_s=20,
                   message=f"fewer than {n} ticks")

    wait_ticks(3)
    first = wait_until(lambda: leader_pid(probe), timeout_s=5)
    assert first in pids

    # 1. the leader is paused past its lease (a GC pause, a frozen VM): another leads,
    #    and the old one, woken, steps down instead of enqueueing its stale ticks
    os.kill(first, signal.SIGSTOP)
    t0 = server_ms(r)
    second = wait_until(lambda: (pid := leader_pid(probe)) not in (None, first) and pid,
                        timeout_s=10)
    took_ms = server_ms(r) - t0
    assert second in pids
    assert took_ms <= (LEASE_S + 1.0) * 1000, took_ms  # within one lease (+ polling)
    n = len(ticks(app, queue_name))
    wait_ticks(n + 2)
    os.kill(first, signal.SIGCONT)
    wait_ticks(n + 4)
    assert leader_pid(probe) == second

    # 2. the leader is SIGKILLed: the lock is not released, its lease runs out
    by_pid[second].kill()
    by_pid[second].wait(10)
    t0 = server_ms(r)
    third = wait_until(lambda: (pid := leader_pid(probe)) not in (None, second) and pid,
                       timeout_s=10)
    took_ms = server_ms(r) - t0
    assert third in pids - {second}
    assert took_ms <= (LEASE_S + 1.0) * 1000, took_ms
    n = len(ticks(app, queue_name))
    wait_ticks(n + 3)

    # 3. stopped schedulers hand over: the lock is free at once
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in procs:
        p.wait(10)
    assert holder(probe.clients, leader_lock_name(probe)) is None
    probe.close()

    # no tick twice; a gap only where a leader was gone, never longer than the takeover
    assert_once_each(ticks(app, queue_name), max_gap_ms=round((LEASE_S + 2.0) * 1000))
    k = app.keys(queue_name)
    assert int(r.hget(k.stats, "enqueued") or 0) == len(ticks(app, queue_name))
    assert queue_name.encode() in r.smembers(f"{app.namespace}:queues")


# --- in this process ----------------------------------------------------------------------


def run_for(app: batchq.App, until: Callable[[], bool], *schedulers: Scheduler,
            timeout_s: float = 15) -> None:
    """Run the schedulers in this process until ``until()`` holds, then stop them."""

    async def main() -> None:
        stop = asyncio.Event()
        tasks = [asyncio.create_task(s.run(stop)) for s in schedulers]
        deadline = time.monotonic() + timeout_s
        try:
            while not await asyncio.to_thread(until):
                assert time.monotonic() < deadline, "condition not met"
                await asyncio.sleep(0.05)
        finally:
            stop.set()
            await asyncio.gather(*tasks)
            await app.aclose()

    asyncio.run(main())


def test_after_downtime_only_the_latest_tick_runs(app, queue_name):
    @app.periodic(every_s=1, queue=queue_name)
    def beat() -> None: ...

    now = server_ms(app.redis)
    # it last ran an hour ago: 3,600 ticks were missed while nothing was scheduling
    app.redis.hset(app.keys(queue_name).periodic, "beat:tick", now - now % 1000 - 3_600_000)
    s = Scheduler(app, lease_s=LEASE_S)
    run_for(app, lambda: len(ticks(app, queue_name)) >= 2, s)
    ts = ticks(app, queue_name)
    assert 2 <= len(ts) <= 4, ts  # not a storm of the missed ones
    assert ts[0] >= now - now % 1000  # the first run is the current tick
    assert_once_each(ts)
    assert s.enqueued == len(ts)


def daily_cron_minutes_ago(minutes: int, tz: str) -> str:
    t = datetime.now(ZoneInfo(tz)) - timedelta(minutes=minutes)
    return f"{t.minute} {t.hour} * * *"


def test_a_missed_cron_tick_is_skipped_or_caught_up_once(app, queue_name):
    tz = "Asia/Kolkata"  # UTC+05:30: the tick must be computed in the schedule's zone
    cron = daily_cron_minutes_ago(3, tz)

    @app.periodic(cron=cron, tz=tz, queue=queue_name)
    def skipped() -> None: ...

    @app.periodic(cron=cron, tz=tz, queue=queue_name, catch_up=True)
    def caught_up() -> None: ...

    @app.periodic(cron=cron, tz=tz, queue=queue_name, catch_up=True)
    def brand_new() -> None: ...

    now = server_ms(app.redis)
    sched = {s.name: s for s in schedules(app)}
    latest = sched["skipped"].latest_tick_ms(now)
    nxt = sched["skipped"].next_tick_ms(now)
    assert 2 * 60_000 <= now - latest <= 4 * 60_000 and nxt == latest + 86_400_000
    state = app.keys(queue_name).periodic
    # both ran yesterday; the scheduler was down over today's tick
    app.redis.hset(state, mapping={"skipped:tick": latest - 86_400_000,
                                   "caught_up:tick": latest - 86_400_000})

    def settled() -> bool:
        return all(st["next_run_s"] for st in batchq.periodic_status(app))

    run_for(app, settled, Scheduler(app, lease_s=LEASE_S))
    raw = app.redis.lrange(app.keys(queue_name).ready_for(0), 0, -1)
    jobs = [codec.decode_entry(e, queue_name) for e in raw]
    assert [(j.task, j.ready_ms) for j in jobs] == [("caught_up", latest)]
    status = {st["name"]: st for st in batchq.periodic_status(app)}
    assert status["skipped"]["last_run_s"] is None
    assert status["skipped"]["last_tick_s"] == (latest - 86_400_000) / 1000
    assert status["caught_up"]["last_tick_s"] == latest / 1000
    assert status["brand_new"]["last_tick_s"] is None
    assert {st["next_run_s"] for st in status.values()} == {nxt / 1000}


def test_two_leaders_at_once_still_enqueue_a_tick_once(app, queue_name):
    @app.periodic(every_s=3600, queue=queue_name, grace_s=3600)
    def hourly() -> None: ...

    a, b = Scheduler(app, owner="a"), Scheduler(app, owner="b")
    scheds = schedules(app)

    async def both() -> None:
        # neither holds the lock: _tick is what a leader that does not know it lost runs
        await asyncio.gather(a._tick(scheds), b._tick(scheds))
        await asyncio.gather(a._tick(scheds), b._tick(scheds))
        await app.aclose()

    asyncio.run(both())
    assert len(ticks(app, queue_name)) == 1
    assert a.enqueued + b.enqueued == 1


def test_status_names_the_leader_and_the_runs(app, queue_name):
    @app.periodic(every_s=1, queue=queue_name, priority=5)
    def beat() -> None: ...

    assert batchq.periodic_status(app) == [{
        "name": "beat", "queue": queue_name, "schedule": "every 1s", "last_run_s": None,
        "last_tick_s": None, "next_run_s": None, "leader": None}]
    s = Scheduler(app, lease_s=LEASE_S, owner="host-a:123")
    seen: list[dict[str, object]] = []

    def ran() -> bool:
        st = batchq.periodic_status(app)[0]
        seen.append(st)
        return st["last_run_s"] is not None

    before = server_ms(app.redis) / 1000
    run_for(app, ran, s)
    st = seen[-1]
    assert st["leader"] == "host-a:123"
    assert isinstance(st["last_run_s"], float) and isinstance(st["next_run_s"], float)
    assert isinstance(st["last_tick_s"], float)
    assert before - 1 <= st["last_tick_s"] <= st["last_run_s"] < st["next_run_s"]
    assert st["next_run_s"] == st["last_tick_s"] + 1
    assert app.redis.llen(app.keys(queue_name).ready_for(5)) >= 1  # the task's priority

    final = batchq.periodic_status(app)[0]
    last, nxt = periodic_metrics(app)
    assert last.name == "batchq_periodic_last_run_timestamp_seconds"
    assert [(m.labels, m.value) for m in last.samples] == [
        ({"task": "beat", "queue": queue_name}, final["last_run_s"])]
    assert [(m.labels, m.value) for m in nxt.samples] == [
        ({"task": "beat", "queue": queue_name}, final["next_run_s"])]
    assert batchq.periodic_status(app)[0]["leader"] is None  # released on stop

    # without the app's tasks (`batchq info` run without an app): read from Redis
    bare = batchq.App(app.redis_url, app.namespace)
    try:
        assert batchq.periodic_status(bare) == [{**batchq.periodic_status(app)[0]}]
        mid_run: dict[str, object] = {}

        def leading() -> bool:
            mid_run.update(batchq.periodic_status(bare)[0])
            return mid_run["leader"] is not None

        run_for(app, leading, Scheduler(app, lease_s=LEASE_S, owner="host-b:7"))
        assert mid_run["leader"] == "host-b:7" and mid_run["schedule"] == "every 1s"
    finally:
        bare.close()


def test_an_app_without_periodic_tasks_does_nothing(app):
    @app.task
    def plain() -> None: ...

    async def main() -> None:
        await asyncio.wait_for(batchq.run_scheduler(app, asyncio.Event()), 1.0)

    asyncio.run(main())
    assert app.redis.exists(lock_keys(app.namespace, leader_lock_name(app)).token) == 0
    assert batchq.periodic_status(app) == []


def test_two_apps_in_one_namespace_with_different_tasks_both_run(app, redis_url, queue_name):
    other = batchq.App(redis_url, app.namespace)

    @app.periodic(every_s=1, queue=queue_name)
    def mine() -> None: ...

    @other.periodic(every_s=1, queue=queue_name)
    def theirs() -> None: ...

    assert leader_lock_name(app) != leader_lock_name(other)

    def both_ran() -> bool:
        raw = app.redis.lrange(app.keys(queue_name).ready_for(0), 0, -1)
        return {codec.decode_entry(e, queue_name).task for e in raw} == {"mine", "theirs"}

    try:
        run_for(app, both_ran, Scheduler(app, lease_s=LEASE_S),
                Scheduler(other, lease_s=LEASE_S))
    finally:
        other.close()
    # each app's status names its own leader lock; both were released on stop
    assert batchq.periodic_status(other)[0]["last_run_s"] is not None
    assert batchq.periodic_status(app)[0]["leader"] is None


def evalsha_calls(r: redis.Redis) -> int:
    """Script round trips the server has served (a follower's only command)."""
    return script_calls(r)


def test_a_follower_sends_one_command_per_third_of_a_lease(app, redis_url, queue_name):
    sched_app = batchq.App(redis_url, app.namespace)

    @sched_app.periodic(every_s=1, queue=queue_name)
    def beat() -> None: ...

    # another process leads (and stays: its lease is long)
    app.redis.set(lock_keys(app.namespace, leader_lock_name(sched_app)).token,
                  "elsewhere:1/token", px=60_000)
    before = evalsha_calls(app.redis)
    t0 = time.monotonic()
    sent: list[int] = []

    def two_seconds() -> bool:
        if time.monotonic() - t0 < 2.0:
            return False
        sent.append(evalsha_calls(app.redis) - before)
        return True

    try:
        run_for(sched_app, two_seconds, Scheduler(sched_app, lease_s=LEASE_S))
    finally:
        sched_app.close()
    # 2 s / (1.5 s / 3) = 4 tries (+1 at the start, +1 if it met NOSCRIPT first); a
    # scheduler that polled would send hundreds
    assert 2 <= sent[0] <= 6, sent
    assert ticks(app, queue_name) == []
    assert app.redis.get(lock_keys(app.namespace, leader_lock_name(sched_app)).token) == \
        b"elsewhere:1/token"
