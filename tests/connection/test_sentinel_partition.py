"""Failover under Sentinel after a network partition: the old primary stays alive but is
cut off from everyone who reaches it.

The primary is reachable only through a TCP proxy (``faults/proxy.py``): the Sentinels
monitor it at the proxy's port, so that is the address they hand to the producer and the
workers, and its two replicas replicate through the same proxy. Mid-run the proxy resets
every connection and refuses new ones: the Sentinels declare the primary down and promote
a replica; the ``-p 2`` fleet of the real CLI must rediscover the new primary and carry
on. With ``min_replicas=1`` no acknowledged enqueue is lost. At the end the partition
heals: the Sentinels demote the old primary, and it must not have received a single
script call (enqueue, pop, ack) nor gained a key since the promotion, although its
address (the proxy) was the primary's for every client before the cut.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest
import redis
from apps import fault_app
from fixtures.faults import *  # noqa: F403
from fixtures.proxy import Proxy, _abort

from batchq.dev.sentinel import EmbeddedSentinels
from connection.test_sentinel_failover import DELAY_S, _fleet, _Producer

pytestmark = pytest.mark.fault

SCRIPT_COMMANDS = ("evalsha", "eval", "evalsha_ro", "eval_ro", "fcall", "fcall_ro")
"""How batchq writes jobs: every enqueue, pop, ack and lease is a script. A replica
receives the effects of its primary's scripts, never the calls, so these counts on the
old primary move only if a client calls it."""


class _Partition(Proxy):
    """A :class:`Proxy` that can cut its server off: every open connection reset, every
    new one refused (the listening socket closed) until :meth:`heal`."""

    partitioned = False

    def cut(self) -> int:
        async def go() -> int:
            self.partitioned = True
            if self._server is not None:
                self._server.close()
            hit = list(self._conns.values())
            for c in hit:
                self._reset(c)
            return len(hit)

        return int(self._call(go()))

    def heal(self) -> None:
        async def go() -> None:
            self._server = await asyncio.start_server(self._handle, self.host, self.port)
            self.partitioned = False

        self._call(go())

    async def _handle(self, client_r: asyncio.StreamReader,
                      client_w: asyncio.StreamWriter) -> None:
        if self.partitioned:  # accepted just before the listener closed
            _abort(client_w)
            return
        await super()._handle(client_r, client_w)


def _script_calls(r: redis.Redis) -> int:
    stats: Any = r.info("commandstats")
    return sum(int(stats.get(f"cmdstat_{c}", {}).get("calls", 0)) for c in SCRIPT_COMMANDS)


def _role(r: redis.Redis) -> str:
    role: Any = r.role()
    name = role[0]
    return name.decode() if isinstance(name, bytes) else str(name)


@pytest.mark.slow
def test_partitioned_primary_workers_follow_and_old_primary_gets_no_writes(
        namespace: str, tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    runs.mkdir()
    proxies: list[_Partition] = []

    def via(port: int) -> int:  # one proxy for the replicas and the Sentinels
        if not proxies:
            proxies.append(_Partition(port).start())
        return proxies[0].port

    with EmbeddedSentinels(replicas=2, replica_via=via, monitor_via=via) as s:
        proxy = proxies[0]
        old = s.primary
        assert old is not None
        assert s.discovered() == (s.host, proxy.port), "clients must reach it via the proxy"
        fleet = _fleet(s, namespace, runs, 1)
        direct = redis.Redis(host=s.host, port=old.port, socket_timeout=5.0)
        try:
            env = {"FAULT_MIN_REPLICAS": "1"}
            sup = fleet.start("-p", "2", "-c", "20", "--lease-s", "5", env=env)
            kids = fleet.wait_children(sup, 2, timeout_s=30)
            prod = _Producer(fleet.app, "p", delay_s=DELAY_S)
            prod.start()
            fleet.until(lambda: len(prod.out.enqueued) >= 300 and len(fleet.completed()) >= 100,
                        30, "jobs flowing")
            assert _script_calls(direct) > 0, "batchq did not write through the proxy"

            t_cut = fault_app.now()
            cut = proxy.cut()
            s.wait_failover(proxy.port, timeout_s=30)
            t_promoted = fault_app.now()
            assert old.is_running() and _role(direct) == "master", \
                "the old primary must still be up and think it is the primary"
            calls_at_promotion = _script_calls(direct)
            keys_at_promotion = set(direct.keys())

            after = len(prod.out.enqueued)
            fleet.until(lambda: len(prod.out.enqueued) >= after + 300, 30,
                        "enqueues succeed on the new primary")
            out = prod.stop()
            fleet.settle(timeout_s=60)

            # the partition heals: the old primary is reachable at the address every
            # client used before the cut, and is a primary until the Sentinels see it
            # again and demote it; nothing from batchq may reach it in that window
            t_heal = time.monotonic()
            proxy.heal()
            keys_while_primary: set[bytes | str] = set()
            while _role(direct) == "master":
                keys_while_primary.update(direct.keys())  # a handful: a test namespace
                assert time.monotonic() - t_heal < 30, "the Sentinels never demoted it"
                time.sleep(0.05)
            demoted_after_s = time.monotonic() - t_heal
            time.sleep(1.0)  # a straggler would have written by now
            calls_after = _script_calls(direct)
            errors: Any = direct.info("errorstats")
            readonly = int(errors.get("errorstat_READONLY", {}).get("count", 0))

            assert out.escaped == [], out.errors[:5]
            assert fleet.workers(sup) == kids, "a worker died instead of following the failover"
            assert "Traceback" not in sup.read_log(), sup.read_log()[-3000:]
            assert calls_after == calls_at_promotion, \
                f"{calls_after - calls_at_promotion} script calls reached the old primary"
            assert readonly == 0, f"{readonly} writes sent to the demoted primary"
            # keys may expire (heartbeats), none may appear
            assert keys_while_primary <= keys_at_promotion, \
                f"keys written on the old primary after the promotion: " \
                f"{sorted(keys_while_primary - keys_at_promotion)}"
            assert _role(direct) == "slave"

            report = fleet.check(out.enqueued, maybe=out.maybe, retried_enqueues=out.retried,
                                 attempted=out.attempted, expired_leases_possible=True)
            ends = [r.end for r in fleet.runs() if r.completed and r.token in prod.began
                    and prod.began[r.token] > t_cut and r.end is not None]
            assert ends, "no job enqueued after the cut ran"
            resume_s = min(ends) - t_cut - DELAY_S
            print(f"\npartition min_replicas=1: {report.summary()}; {cut} connections cut, "
                  f"promoted after {t_promoted - t_cut:.2f}s, fleet resumed after "
                  f"{resume_s:.2f}s; NotReplicated {prod.not_replicated}; healed, demoted "
                  f"after {demoted_after_s:.2f}s with {calls_after - calls_at_promotion} "
                  f"script calls and {readonly} READONLY on it")
            assert report.lost == [], report.details()
            assert report.valid, report.details()
            assert resume_s < 30
        finally:
            direct.close()
            fleet.cleanup()
            for p in proxies:
                p.stop()
