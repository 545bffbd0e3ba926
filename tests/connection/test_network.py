"""Fault 4: the network between batchq and Redis fails (``faults/proxy.py`` on loopback).

* a connection reset while the worker is idle, blocked in ``BLPOP`` on its wake lists;
* a connection reset in the middle of a ``pop.lua`` reply that carries jobs: the jobs
  are reserved in Redis but the worker never saw them, so they come back when the lease
  expires (as attempt 2) and run once;
* a storm of resets of every connection while jobs flow and a producer enqueues;
* Redis unreachable (a blackhole: bytes dropped, no error) for a while, with a producer
  and a worker running: enqueue raises ``EnqueueError`` while Redis is gone and never
  reports success without a write.

Workers and (where said) the producer go through the proxy; the test inspects Redis
directly.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from urllib.parse import urlsplit

import checker
import pytest
from apps import fault_app
from fixtures.faults import *  # noqa: F403
from fixtures.faults import FleetFactory
from fixtures.fleet import Fleet, Producer
from fixtures.proxy import Proxy
from helpers import wait_until

from batchq.store.scripts import _Lua

pytestmark = pytest.mark.fault

POP_SHA = _Lua("pop").sha.encode()


@pytest.fixture
def proxy(redis_url: str) -> Iterator[Proxy]:
    # same server and database as the rest of the test (db 15 on an external Redis)
    parts = urlsplit(redis_url)
    db = int(parts.path.strip("/") or 0)
    with Proxy(parts.port or 6379, db=db) as p:
        yield p


def _valid(fleet: Fleet, enqueued: list[str], **kw: object) -> checker.Report:
    fleet.settle()
    report = fleet.check(enqueued, **kw)  # type: ignore[arg-type]
    print(f"\nchecker: {report.summary()}")
    assert report.valid, report.details()
    assert fleet.leftovers() == []
    return report


def test_reset_of_a_blocked_pop_connection(proxy: Proxy, redis_url: str,
                                           fleet_on: FleetFactory) -> None:
    fleet = fleet_on(proxy.url, direct_url=redis_url, producer_url=redis_url)
    w = fleet.start("-c", "20", "--lease-s", "2")
    work = fleet.app.tasks["work"]
    tokens = [f"a{i}" for i in range(10)]
    work.enqueue_many(tokens)
    fleet.wait_completed(tokens, 10)

    delays = []
    for round_ in range(2):
        time.sleep(0.6)  # idle: blocked in BLPOP on the wake list
        assert proxy.reset_all(match=b"BLPOP") == 1, "the worker was not blocked in BLPOP"
        if round_:  # let it come back first, then see that it still wakes at once
            time.sleep(1.0)
        batch = [f"b{round_}-{i}" for i in range(20)]
        t0 = fault_app.now()
        work.enqueue_many(batch)
        fleet.wait_completed(batch, 10)
        delays.append(max(r.start for r in fleet.runs() if r.token in set(batch)) - t0)
        tokens += batch
    print(f"\nenqueue-to-start after a reset of the blocked pop: "
          f"{', '.join(f'{d:.2f}s' for d in delays)}")
    assert max(delays[1:]) < 1.0, delays  # blocked again, and woken by the next enqueue
    assert delays[0] < 2.0, delays
    assert w.poll() is None
    assert "blocking wait failed" in w.read_log()
    assert "Traceback" not in w.read_log(), w.read_log()
    _valid(fleet, tokens, killed_pids=())


def test_reset_in_the_middle_of_a_pop_reply(proxy: Proxy, redis_url: str,
                                            fleet_on: FleetFactory) -> None:
    fleet = fleet_on(proxy.url, direct_url=redis_url, producer_url=redis_url)
    w = fleet.start("-c", "50", "--fetch-batch", "50", "--lease-s", "2")
    work = fleet.app.tasks["work"]
    tokens: list[str] = []
    for attempt in range(5):
        time.sleep(0.5)  # idle
        cut = proxy.reset_after_reply(20, match=POP_SHA)
        batch = [f"p{attempt}-{i}" for i in range(50)]
        work.enqueue_many(batch)
        tokens += batch
        assert cut.fired.wait(5), "no pop reply was cut"
        n = int(cut.head[1 : cut.head.index(b"\r")])
        if n > 7:  # the cut reply carried jobs (7 header fields, then the entries)
            break
        fleet.wait_completed(batch, 10)
    else:
        pytest.fail("every cut hit an empty pop reply")
    print(f"\ncut a pop reply of {n - 7} jobs after {len(cut.head)} bytes: {cut.head!r}")
    fleet.wait_completed(tokens, 15)
    runs = [r for r in fleet.runs() if r.token in set(batch)]
    # the jobs of the cut reply were reserved in Redis and reaped after their lease
    assert {r.attempt for r in runs} >= {2}, sorted({r.attempt for r in runs})
    assert w.poll() is None and "Traceback" not in w.read_log(), w.read_log()
    _valid(fleet, tokens, killed_pids=())


def test_storm_of_connection_resets(proxy: Proxy, redis_url: str,
                                    fleet_on: FleetFactory) -> None:
    # workers and the producer both go through the proxy
    fleet = fleet_on(proxy.url, direct_url=redis_url)
    tokens = [f"s{i}" for i in range(800)]
    fleet.app.tasks["work"].enqueue_many([(t, 0.02) for t in tokens])
    sup = fleet.start("-p", "2", "-c", "50", "--lease-s", "2")
    fleet.wait_children(sup, 2)
    prod = Producer(fleet.app, "q", secs=0.02, pause_s=0.005)
    prod.start()
    fleet.until(lambda: len(fleet.completed()) >= 200, 15, "jobs flowing")
    resets = 0
    for _ in range(5):
        resets += proxy.reset_all()
        time.sleep(0.3)
    out = prod.stop()
    assert out.escaped == [], out.errors[:5]
    enqueued = tokens + out.enqueued
    fleet.wait_completed(enqueued, 30)
    crashed = fleet.seen - fleet.workers(sup) - {fleet.metrics_pid(sup)}
    print(f"\n{resets} connections reset; producer: {len(out.enqueued)} enqueued, "
          f"{len(out.maybe)} unknown, {len(out.retried)} retried; worker processes that "
          f"died: {len(crashed)}")
    # leases (2 s, extended every 0.7 s) survive a reset: no duplicate is allowed
    # beyond a double write by a retried enqueue (README: "Reconnects do not double
    # jobs") or a run on a worker process that died
    _valid(fleet, enqueued, maybe=out.maybe, retried_enqueues=out.retried,
           killed_pids=crashed, attempted=len(tokens) + out.attempted)
    # fixed (see test_reset_of_idle_pooled_connections_does_not_crash_the_worker):
    # worker processes crash on a reset
    assert not crashed, "worker processes died:\n" + "\n".join(
        line for line in sup.read_log().splitlines()
        if " died " in line or "crashed" in line or line.startswith("RuntimeError"))[-3000:]
    assert "Traceback" not in sup.read_log(), sup.read_log()[-6000:]


def test_reset_of_idle_pooled_connections_does_not_crash_the_worker(
        proxy: Proxy, redis_url: str, fleet_on: FleetFactory) -> None:
    """Fixed: workers run on uvloop, where writing to a connection the peer has reset
    raises ``RuntimeError("unable to perform operation on <TCPTransport closed=True
    ...>; the handler is closed")`` from redis-py's ``send_packed_command`` (with the
    stdlib loop the same write raises ``redis.ConnectionError``). The worker catches
    only ``redis.ConnectionError``/``TimeoutError``/``OSError``/``RedisError``
    (``worker._REDIS_ERRORS``), so the first pop on a pooled connection that was reset
    while idle (a Redis restart or failover, an idle timeout of a NAT or load balancer,
    ``CLIENT KILL``) escapes ``_fetch_loop`` and the process exits 1 ("worker crashed");
    without ``-p`` the worker is gone. The same error escapes the flush, extend and
    heartbeat loops (ending them silently) and ``aenqueue`` under uvloop."""
    fleet = fleet_on(proxy.url, direct_url=redis_url, producer_url=redis_url)
    w = fleet.start("-c", "20", "--lease-s", "2")
    work = fleet.app.tasks["work"]
    first = [f"i{i}" for i in range(10)]
    work.enqueue_many(first)
    fleet.wait_completed(first, 10)
    time.sleep(0.6)  # idle: the pop connection is back in the pool, BLPOP blocks
    assert proxy.reset_all() >= 2
    then = [f"j{i}" for i in range(10)]
    work.enqueue_many(then)

    def done() -> bool:
        if w.poll() is not None:
            raise AssertionError(f"the worker exited {w.poll()}:\n{w.read_log()[-3000:]}")
        return set(then) <= fleet.completed()

    wait_until(done, 10, 0.05)
    assert "Traceback" not in w.read_log(), w.read_log()[-3000:]
    _valid(fleet, first + then, killed_pids=())


def test_aenqueue_on_uvloop_after_a_reset_raises_no_runtime_error(
        proxy: Proxy, fleet_on: FleetFactory, redis_url: str) -> None:
    """Fixed (the same uvloop error on the producer side): a handler that enqueues
    follow-up jobs runs on the worker's uvloop; after a reset of its pooled connection
    ``aenqueue`` raises ``RuntimeError`` instead of retrying (or raising
    ``EnqueueError``), because ``producer._RETRY_WRITE_ERRORS`` is only
    ``(redis.ConnectionError, redis.TimeoutError)``."""
    import asyncio

    import uvloop

    fleet = fleet_on(proxy.url, direct_url=redis_url)
    work = fleet.app.tasks["work"]
    outcomes: list[str] = []

    async def produce() -> None:
        for i in range(3):
            await work.aenqueue(f"u{i}")
            proxy.reset_all()
            await asyncio.sleep(0.05)
            try:
                await work.aenqueue(f"v{i}")
                outcomes.append("ok")
            except Exception as exc:
                outcomes.append(f"{type(exc).__name__}: {exc}")
        await fleet.app.aclose()

    uvloop.run(produce())
    print(outcomes)
    assert all(o == "ok" or o.startswith("EnqueueError") for o in outcomes), outcomes


@pytest.mark.parametrize("outage_s", [
    3.0, pytest.param(10.0, marks=pytest.mark.slow)], ids=["3s", "10s"])
def test_redis_unreachable(proxy: Proxy, redis_url: str, fleet_on: FleetFactory,
                           outage_s: float) -> None:
    lease_s = 8.0
    worker_timeout_s = 3.0
    # the producer's client gives up on a silent server after 0.5 s a try
    fleet = fleet_on(proxy.url, direct_url=redis_url, socket_timeout_s=0.5)
    w = fleet.start("-c", "50", "--lease-s", str(lease_s),
                    env={"FAULT_SOCKET_TIMEOUT": str(worker_timeout_s)})
    prod = Producer(fleet.app, "u", secs=0.05, pause_s=0.005)
    prod.start()
    fleet.until(lambda: len(fleet.completed()) >= 100, 15, "jobs flowing")

    t_on = fault_app.now()
    proxy.blackhole()
    time.sleep(outage_s)
    reset = proxy.blackhole(False)
    t_off = fault_app.now()
    n = len(prod.out.enqueued)
    fleet.until(lambda: len(prod.out.enqueued) >= n + 100, 30, "enqueues succeed again")
    out = prod.stop()
    assert out.escaped == [], out.errors[:5]
    fleet.wait_completed(out.enqueued, 60)

    failed_calls = [(a - t_on, b - t_on) for a, b, _ in out.errors]
    print(f"\noutage {outage_s:.0f}s: {proxy.dropped_bytes} bytes dropped, {reset} "
          f"connections reset after it; {len(out.errors)} enqueue calls raised "
          f"EnqueueError ({len(out.maybe)} jobs unknown, {len(out.refused)} refused), the "
          f"first {failed_calls[:1]} s after the outage began")
    if outage_s >= 10:
        # retries last 5 x 0.5 s + 3.75 s of backoff: a call begun early in the outage
        # must give up while Redis is still gone
        assert out.errors, "no enqueue failed during a 10 s outage"
        assert all(b <= outage_s + 1 for _, b in failed_calls), failed_calls
        assert all("EnqueueError" not in m for _, _, m in out.errors)
    assert w.poll() is None and "Traceback" not in w.read_log(), w.read_log()[-3000:]
    lease_lapse = checker.outage_predicate([(t_on, t_off)], lease_s,
                                           slack_s=worker_timeout_s + 2)
    _valid(fleet, out.enqueued, maybe=out.maybe, retried_enqueues=out.retried,
           killed_pids=(), expired_leases_possible=lease_lapse, attempted=out.attempted)
