"""End to end: the periodic scheduler that every worker process runs, across two
``batchq worker apps.periodic_app:app -p 2`` supervisors (real CLI processes).

The supervisor whose child leads is SIGKILLed with its children (the leader lock is not
released: its lease must run out). A process of the other supervisor takes over, and
every tick runs exactly once: no tick twice, and no gap between two ticks longer than
the leader's lease plus a second. The handler records its job's tick (``Job.ready_ms``)
outside the queue (``apps.periodic_app``).
"""

from __future__ import annotations

import itertools
import signal
import time
from collections.abc import Iterator

import pytest
import redis
from apps import periodic_app
from helpers import CliProcess
from workers import WorkerFleet

from batchq.produce.periodic import LEASE_S, periodic_status

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(90)]

APP = "apps.periodic_app:app"


class Fleet(WorkerFleet):
    def __init__(self, url: str, ns: str, r: redis.Redis) -> None:
        super().__init__(url, r, periodic_app.build(ns, url), APP)
        self.ns = ns

    def app_env(self) -> dict[str, str | None]:
        return {"PERIODIC_NS": self.ns}

    def ticks(self) -> list[tuple[int, int]]:
        """(tick ms, pid that ran it), in the order they ran."""
        out = []
        for raw in self.r.lrange(periodic_app.ticks_key(self.ns), 0, -1):
            tick, pid = raw.split()
            out.append((int(tick), int(pid)))
        return out

    def leader(self) -> int | None:
        """The pid of the process whose scheduler leads (``periodic_status``)."""
        owner = periodic_status(self.app)[0]["leader"]
        return None if owner is None else int(owner.rsplit(":", 1)[1])

    def wait_ticks(self, n: int, timeout_s: float = 15.0) -> list[tuple[int, int]]:
        return self.until(lambda: len(t := self.ticks()) >= n and t, timeout_s,
                          f"{n} ticks run")


@pytest.fixture
def fleet(redis_url: str, namespace: str) -> Iterator[Fleet]:
    client = redis.Redis.from_url(redis_url)
    f = Fleet(redis_url, namespace, client)
    try:
        yield f
    finally:
        f.cleanup()
        client.close()


def test_a_killed_leaders_supervisor_is_taken_over_and_each_tick_runs_once(
        fleet: Fleet) -> None:
    sups = [fleet.start("-p", "2"), fleet.start("-p", "2")]
    kids = {s.pid: fleet.wait_children(s, 2) for s in sups}
    assert len(set().union(*kids.values())) == 4
    fleet.wait_ticks(2)

    # kill in the middle of a second, just after a tick ran: the tick before the kill
    # is known, and no job of it is left in the killed processes
    n = len(fleet.ticks())
    fleet.wait_ticks(n + 1)
    time.sleep(0.3)
    leader = fleet.until(fleet.leader, 5, "a leader")
    [victim] = [s for s in sups if leader in fleet.children(s)]
    [survivor] = [s for s in sups if s is not victim]
    killed = fleet.kill_fleet(victim)
    assert leader in killed
    dead_ms = _server_ms(fleet.r)  # every killed process is gone by now
    before = fleet.ticks()

    new = fleet.until(lambda: (p := fleet.leader()) not in (None, leader) and p,
                      LEASE_S + 5, "another process leads")
    assert new in fleet.workers(survivor)
    fleet.wait_ticks(len(before) + 3, timeout_s=LEASE_S + 10)

    # a stopped survivor hands the leadership over (no lease to wait for) and exits 0
    survivor.send_signal(signal.SIGTERM)
    assert survivor.wait(20) == 0, survivor.read_log()
    assert fleet.leader() is None
    _assert_each_tick_once(fleet, dead_ms, killed, survivor)


def _server_ms(r: redis.Redis) -> int:
    sec, usec = r.time()
    return int(sec) * 1000 + int(usec) // 1000


def _assert_each_tick_once(fleet: Fleet, dead_ms: int, killed: set[int],
                           survivor: CliProcess) -> None:
    runs = fleet.ticks()
    shown = [(t - dead_ms, pid) for t, pid in runs]  # (ms after the kill, pid)
    ticks = [t for t, _ in runs]
    assert len(set(ticks)) == len(ticks), f"a tick ran twice: {ticks}"
    assert ticks == sorted(ticks), ticks
    assert all(t % 1000 == 0 for t in ticks), ticks
    gaps = [b - a for a, b in itertools.pairwise(ticks)]
    assert max(gaps) <= (LEASE_S + 1) * 1000, f"a gap over the lease + 1 s: {shown}"
    # the takeover really happened: the ticks after the kill ran in the survivor only
    after = [pid for t, pid in runs if t > dead_ms]
    assert len(after) >= 3 and not set(after) & killed, (shown, killed)
    # every tick enqueued ran: nothing is left in the queue or held by a dead process
    st = fleet.stats()
    assert (st.ready, st.delayed, st.reserved, st.dead) == (0, 0, 0, 0), st
    enqueued = int(fleet.r.hget(fleet.app.keys("default").stats, "enqueued") or 0)
    assert enqueued == len(ticks), (enqueued, ticks)
    assert survivor.returncode == 0
