"""Fault 5: Redis reaches ``maxmemory`` with ``noeviction`` (its own small server).

A full Redis refuses every command that may grow memory (``denyoom``), and inside a
script it refuses the script's first such write (later writes of a script that already
wrote are let through, so a script never stops halfway). Expected: enqueue raises a
clear ``EnqueueError`` and writes nothing; ``enqueue_many`` reports exactly what it wrote;
workers keep draining, and their acks free memory.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator

import pytest
import redis
from fixtures.faults import *  # noqa: F403
from fixtures.faults import FleetFactory
from helpers import free_port, wait_until

import batchq
from batchq.dev.server import EmbeddedServer
from batchq.store import codec
from batchq.store.scripts import calls
from batchq.store.scripts.replies import decode_pop_reply

pytestmark = pytest.mark.fault

PAD = "x" * 300
MAXMEMORY = "4mb"


@pytest.fixture
def small() -> Iterator[EmbeddedServer]:
    with EmbeddedServer(extra_args=["--maxmemory", MAXMEMORY]) as server:
        yield server


def fill(task: batchq.Task | batchq.TaskCall, prefix: str) -> tuple[list[str], str]:
    """Enqueue single-chunk batches of shrinking size (1000, 100, 10, 1) until Redis
    refuses even one job: it is then full to the brim. Returns the tokens written (each
    call is one script: all or nothing) and the last refusal's message."""
    written: list[str] = []
    message = ""
    n = 0
    for size in (1000, 100, 10, 1):
        while True:
            toks = [f"{prefix}{n + i}" for i in range(size)]
            n += size
            try:
                task.enqueue_many([(t, 0.0, "", PAD) for t in toks])
            except batchq.EnqueueError as exc:
                assert exc.written == 0 and exc.unknown == 0, (exc, exc.written, exc.unknown)
                message = str(exc)
                break
            written += toks
    return written, message


def clamp(r: redis.Redis, below: int = 256 * 1024) -> int:
    """Keep Redis full: right after a refusal ``used_memory`` sinks back under the limit
    within a fraction of a second (client buffers shrink), so set ``maxmemory`` that far
    below what is used now. Draining about ``below`` bytes of jobs frees it again."""
    used = int(r.info("memory")["used_memory"])
    r.config_set("maxmemory", used - below)
    return used - below


IDLE = "30000|idle-worker"


def _registered(r: redis.Redis, idle: str) -> bool:
    """Register an idle worker (refused while the Redis is still over its limit)."""
    try:
        r.zadd(idle, {IDLE: 1e15})
    except redis.ResponseError:
        return False
    return True


def ready_entries(r: redis.Redis, app: batchq.App, queue: str = "default") -> list[bytes]:
    return [e for key in app.keys(queue).ready for e in r.lrange(key, 0, -1)]


def enqueued_stat(r: redis.Redis, app: batchq.App, queue: str = "default") -> int:
    return int(r.hget(app.keys(queue).stats, "enqueued") or 0)


def test_enqueue_into_a_full_redis_raises_enqueue_error_and_writes_nothing(
        small: EmbeddedServer, fleet_on: FleetFactory) -> None:
    fleet = fleet_on(small.url)
    work = fleet.app.tasks["work"]
    written, message = fill(work, "f")
    assert "maxmemory" in message and "work" in message, message
    k = fleet.app.keys("default")
    # an idle worker registered (as its empty pop registers it): a job handed off is
    # written too, so the hand-off must be refused like the push
    wait_until(lambda: _registered(fleet.r, k.idle), 5, message="the registration written")
    clamp(fleet.r)
    before = (fleet.r.llen(k.ready_for(0)), fleet.r.zcard(k.delayed),
              enqueued_stat(fleet.r, fleet.app))
    assert before[0] == before[2] == len(written)

    with pytest.raises(batchq.EnqueueError, match="maxmemory") as err:
        work.enqueue("one", 0.0, "", PAD)
    assert (err.value.written, err.value.unknown, err.value.ids) == (0, 0, [])
    with pytest.raises(batchq.EnqueueError, match="maxmemory"):
        work.options(delay_s=5).enqueue("later", 0.0, "", PAD)

    async def aenqueue() -> None:
        try:
            await work.aenqueue("async", 0.0, "", PAD)
        finally:
            await fleet.app.aclose()

    import asyncio

    with pytest.raises(batchq.EnqueueError, match="maxmemory"):
        asyncio.run(aenqueue())
    after = (fleet.r.llen(k.ready_for(0)), fleet.r.zcard(k.delayed),
             enqueued_stat(fleet.r, fleet.app))
    assert after == before
    assert fleet.r.zscore(k.idle, IDLE) is not None  # not taken: nothing was handed
    assert fleet.r.hlen(k.inflight) == 0 and fleet.r.lrange(k.wake, 0, -1) in ([], [b"1"])
    tokens = {codec.decode_entry(e, "default").args[0] for e in ready_entries(fleet.r,
                                                                               fleet.app)}
    assert tokens == set(written)
    print(f"\nfull after {len(written)} jobs of {len(PAD)} bytes: {message}")


def test_enqueue_many_into_a_filling_redis_reports_exactly_what_it_wrote(
        small: EmbeddedServer, fleet_on: FleetFactory) -> None:
    fleet = fleet_on(small.url)
    work = fleet.app.tasks["work"]
    tokens = [f"m{i}" for i in range(20_000)]
    with pytest.raises(batchq.EnqueueError) as err:
        work.enqueue_many([(t, 0.0, "", PAD) for t in tokens])
    e = err.value
    assert "maxmemory" in str(e), e
    assert e.unknown == 0
    assert 0 < e.written == len(e.ids) < len(tokens)
    entries = ready_entries(fleet.r, fleet.app)
    jobs = [codec.decode_entry(x, "default") for x in entries]
    # exactly the reported jobs are in Redis, and nothing else
    assert [j.id for j in jobs] == e.ids
    assert enqueued_stat(fleet.r, fleet.app) == e.written
    # no script half-applied: the jobs written are whole chunks of 1,000 consecutive items
    assert e.written % 1000 == 0, e.written
    got = [j.args[0] for j in jobs]
    chunks = {tuple(got[i : i + 1000]) for i in range(0, len(got), 1000)}
    for chunk in chunks:
        first = tokens.index(chunk[0])
        assert first % 1000 == 0 and list(chunk) == tokens[first : first + 1000]
    print(f"\nenqueue_many of {len(tokens)}: EnqueueError after writing {e.written} "
          f"({len(chunks)} whole chunks): {e}")


def test_workers_keep_draining_a_full_redis(small: EmbeddedServer,
                                            fleet_on: FleetFactory) -> None:
    fleet = fleet_on(small.url)
    mport = free_port()
    # the fleet starts first (a worker cannot start against a full Redis: see below),
    # fetching paused while Redis fills up
    sup = fleet.start("-p", "2", "-c", "50", "--lease-s", "5", "--metrics-port", str(mport))
    fleet.wait_children(sup, 2)
    os.kill(sup.pid, signal.SIGTSTP)
    fleet.until(lambda: sup.read_log().count("fetching paused") >= 2, 10, "paused")
    work = fleet.app.tasks["work"]
    written, _ = fill(work, "d")
    clamp(fleet.r)
    with pytest.raises(batchq.EnqueueError):  # full
        work.enqueue("refused")
    os.kill(sup.pid, signal.SIGCONT)
    fleet.wait_completed(written, 60)
    fleet.settle()
    # acks freed the memory: enqueue works again
    again = [f"a{i}" for i in range(100)]
    work.enqueue_many(again)
    fleet.wait_completed(again, 20)
    fleet.settle()
    report = fleet.check(written + again, killed_pids=())
    print(f"\nchecker: {report.summary()}")
    assert report.valid, report.details()
    assert fleet.leftovers() == []
    assert "Traceback" not in sup.read_log(), sup.read_log()[-3000:]
    rec = fleet.reconcile(mport)
    print(f"metrics: {rec}")


def test_a_worker_starts_against_a_full_redis(small: EmbeddedServer,
                                              fleet_on: FleetFactory) -> None:
    """Fixed: ``Worker._startup`` registers the queues with a bare ``SADD NS:queues``,
    which a full Redis refuses (``OutOfMemoryError``, a ``denyoom`` command even when
    the member exists). It is not caught: the worker dies with a traceback (exit 1), and
    under ``-p`` the supervisor replaces it again and again. A fleet (re)started while
    Redis is full never drains it, though draining is what would free the memory."""
    fleet = fleet_on(small.url)
    written, _ = fill(fleet.app.tasks["work"], "s")
    clamp(fleet.r)
    w = fleet.start("-c", "50", wait_ready=False)

    def done() -> bool:
        if w.poll() is not None:
            raise AssertionError(f"the worker exited {w.poll()}:\n{w.read_log()[-2500:]}")
        return set(written) <= fleet.completed()

    wait_until(done, 30, 0.1)
    fleet.settle()
    report = fleet.check(written, killed_pids=())
    assert report.valid, report.details()


@pytest.mark.parametrize("what", ["due-retry", "expired-lease", "expired-bundle"])
def test_a_full_redis_drains_with_a_due_job_or_an_expired_lease(
        small: EmbeddedServer, fleet_on: FleetFactory, what: str) -> None:
    """Fixed: ``pop.lua`` first moves due delayed jobs (``RPUSH``) and reaps expired leases
    (``LPUSH``, or the dead record's ``HSET``); on a full Redis that first write is
    refused and the whole script fails, so the pop of ready jobs after it never runs.
    While one delayed job is due (a retry's backoff ended) or one lease has expired (its
    worker died, perhaps OOM-killed), no worker can pop anything, no ack frees memory,
    and the queue is stuck for good."""
    fleet = fleet_on(small.url)
    work = fleet.app.tasks["work"]
    # started first (see test_a_worker_starts_against_a_full_redis), fetching paused
    mport = free_port()
    sup = fleet.start("-p", "1", "-c", "50", "--lease-s", "5", "--metrics-port", str(mport))
    fleet.wait_children(sup, 1)
    os.kill(sup.pid, signal.SIGTSTP)
    fleet.until(lambda: "fetching paused" in sup.read_log(), 10, "paused")
    special = ["special"]
    if what == "due-retry":
        work.options(delay_s=0.5).enqueue(special[0])
    else:  # a worker took it (alone, or two in a bundle) with a 200 ms lease and died
        if what == "expired-bundle":
            special.append("special2")
        work.enqueue_many([(t,) for t in special])
        k = fleet.app.keys("default")
        got = decode_pop_reply(fleet.app.sync_scripts.call(
            calls.pop(k, 2, 200, 100, bundle=what == "expired-bundle")))
        assert len(got.jobs) == len(special)
        assert bool(got.bundle) == (what == "expired-bundle")
    written, _ = fill(work, "b")
    clamp(fleet.r)
    time.sleep(0.6)  # the delayed job is due / the lease has expired
    os.kill(sup.pid, signal.SIGCONT)
    t0 = time.monotonic()

    def drained() -> bool:
        done = fleet.completed()
        if not done and time.monotonic() - t0 > 3:
            fails = [x for x in sup.read_log().splitlines() if "fetch failed" in x]
            raise AssertionError(f"0 of {len(written) + 1} jobs ran in 3 s; the worker "
                                 f"logged {len(fails)} failed fetches, e.g.\n{fails[:1]}")
        return set(written) | set(special) <= done

    wait_until(drained, 15, 0.1)
    fleet.settle()
    report = fleet.check([*written, *special], killed_pids=())
    assert report.valid, report.details()


def test_lease_extension_is_not_refused_by_a_full_redis(
        small: EmbeddedServer, fleet_on: FleetFactory) -> None:
    """Fixed: ``extend.lua``'s first write is ``ZADD XX`` (``denyoom``), so a full Redis
    refuses every lease extension. A job running longer than its lease loses it although
    its worker is healthy and Redis reachable; once memory is freed, the next pop by any
    worker reaps the lease and the job runs a second time while the first run goes on: a
    duplicate that is neither a dead worker nor a stalled one."""
    fleet = fleet_on(small.url)
    work = fleet.app.tasks["work"]
    w1 = fleet.start("-q", "long", "-c", "5", "--lease-s", "1.5")
    work.options(queue="long").enqueue("long-job", 3.0)
    (first,) = fleet.until(lambda: [r for r in fleet.runs() if r.token == "long-job"], 10,
                           "the long job runs")
    fill(work, "f")  # on "default", not served by W1: memory stays full
    clamp(fleet.r)
    k = fleet.app.keys("long")
    (_, deadline_ms), = fleet.r.zrange(k.reserved, 0, 0, withscores=True)
    sec, usec = fleet.r.time()
    time.sleep(max(0.0, deadline_ms / 1000 + 0.3 - (sec + usec / 1e6)))
    # the lease has expired on the server (its extensions were refused); memory is freed
    # and another worker's fetch reaps it, in one transaction so that no extension of
    # W1's can slip in between (W1's own pops would do the same a moment later)
    pipe = fleet.r.pipeline(transaction=True)
    pipe.config_set("maxmemory", 0)
    fleet.app.sync_scripts.call(calls.pop(k, 0, 30_000, 100), client=pipe)
    _, popped = pipe.execute()
    fleet.until(lambda: len([r for r in fleet.runs() if r.token == "long-job"
                             and r.completed]) >= 1 + decode_pop_reply(popped).reaped, 10,
               "the runs end")
    fleet.app.queue("default").clear()
    fleet.settle(("default", "long"))
    runs = [r for r in fleet.runs() if r.token == "long-job"]
    refused = [x for x in w1.read_log().splitlines() if "extending leases failed" in x]
    shown = [(r.attempt, r.pid, round(r.start - first.start, 2),
              r.end and round(r.end - first.start, 2)) for r in runs]
    print(f"\nlong job runs (attempt, pid, start, end): {shown}; {len(refused)} extensions "
          f"refused; reaped by the pop after memory was freed: {popped[4]}")
    report = fleet.check(["long-job"], queues=("long",), killed_pids=())
    assert report.valid, (
        f"{report.details()}\nW1 (pid {w1.pid}, alive: {w1.poll() is None}) had its lease "
        f"extensions refused by the full Redis, e.g.\n{refused[:1]}")
