"""Fault 3: Redis killed (SIGKILL) and restarted on the same port from its AOF
(``appendfsync always``) while a producer enqueues in a loop and a fleet works.

Nothing whose enqueue returned may be lost; the workers reconnect without a crash; the
restarted server has an empty script cache, so every client meets NOSCRIPT and must load
the scripts again; ``/metrics`` reconciles at the end.
"""

from __future__ import annotations

import os
import signal
import time

import pytest
import redis
from fixtures.faults import *  # noqa: F403
from fixtures.faults import FleetFactory
from fixtures.fleet import Producer
from helpers import free_port, function_libraries

from batchq.dev.server import EmbeddedServer
from batchq.store.scripts import NAMES, _Lua

pytestmark = pytest.mark.fault

FNAMES = {n: _Lua(n).fname for n in NAMES}


def test_redis_killed_and_restarted_from_aof_loses_no_acknowledged_enqueue(
        fleet_on: FleetFactory, tmp_path) -> None:
    server = EmbeddedServer(free_port(), dir=str(tmp_path / "valkey"), appendonly=True,
                            extra_args=["--appendfsync", "always"])
    server.start()
    try:
        fleet = fleet_on(server.url)
        mport = free_port()
        sup = fleet.start("-p", "2", "-c", "50", "--lease-s", "5", "--metrics-port", str(mport))
        kids = fleet.wait_children(sup, 2, timeout_s=30)
        prod = Producer(fleet.app, "r", secs=0.01)
        prod.start()
        fleet.until(lambda: len(prod.out.enqueued) >= 300 and len(fleet.completed()) >= 100,
                    20, "jobs flowing")

        pid = server.pid
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        t_kill = time.monotonic()
        before = len(prod.out.enqueued)
        time.sleep(1.5)
        server.stop()  # forgets the dead process; the directory (and AOF) stays
        server.start()
        down_s = time.monotonic() - t_kill
        assert server.pid != pid
        r = redis.Redis.from_url(server.url)
        fleet.until(lambda: len(prod.out.enqueued) >= before + 300, 20,
                    "enqueues succeed again")
        out = prod.stop()
        fleet.wait_completed(out.enqueued, timeout_s=40)
        fleet.settle()

        assert out.escaped == [], out.errors[:5]
        # functions are kept in the AOF (scripts sent by EVALSHA were not, and every
        # process had to load them again): the restarted server has them
        errors = r.info("errorstats")
        noscript = errors.get("errorstat_ERR", {}).get("count", 0)
        loads = r.info("commandstats").get("cmdstat_function|load", {}).get("calls", 0)
        libs = function_libraries(r)
        assert {FNAMES[n] for n in ("enqueue", "pop", "ack")} <= libs, (libs, loads)
        assert fleet.workers(sup) == kids, "a worker process died instead of reconnecting"
        assert "Traceback" not in sup.read_log(), sup.read_log()[-3000:]

        report = fleet.check(out.enqueued, maybe=out.maybe, retried_enqueues=out.retried,
                             attempted=out.attempted)
        print(f"\nchecker: {report.summary()}; down {down_s:.1f}s; enqueue errors "
              f"{len(out.errors)} (maybe {len(out.maybe)}, refused {len(out.refused)}); "
              f"error replies {noscript}, FUNCTION LOAD calls {loads}")
        assert report.valid, report.details()
        assert fleet.leftovers() == []

        # an ack applied just before the kill, its reply lost, is sent again and counted
        # stale: the only slack allowed
        rec = fleet.reconcile(mport, allow_stale=True)
        print(f"metrics: {rec}")
        r.close()
    finally:
        server.stop()
