"""Locks and periodic jobs on a real 3-master Redis Cluster: every script call stays in
one slot (the lock's own tag; the target queue's tag for a tick), with queues on
different nodes."""

from __future__ import annotations

import asyncio
import time

import pytest
from fixtures.cluster import *  # noqa: F403
from fixtures.cluster import queues_on_nodes

import batchq
from batchq.dev.cluster import EmbeddedCluster
from batchq.produce.periodic import Scheduler
from batchq.store import codec
from batchq.tasks.lock import lock_keys

pytestmark = [pytest.mark.integration, pytest.mark.cluster, pytest.mark.timeout(120)]


def test_lock_on_a_cluster(cluster: EmbeddedCluster, namespace: str) -> None:
    app = batchq.App(cluster.url, namespace)
    try:
        fences = []
        for name in ("a", "b", "c", "a"):  # names hash to different slots
            with app.lock(name, ttl_s=10) as lk:
                assert lk.fence is not None
                fences.append(lk.fence)
                with pytest.raises(batchq.LockNotAcquired):
                    app.lock(name).acquire()
                lk.extend(ttl_s=20)
        assert fences == [1, 1, 1, 2]
        assert app.redis.exists(lock_keys(namespace, "a").token) == 0
    finally:
        app.close()


def test_periodic_ticks_on_queues_of_every_node(cluster: EmbeddedCluster,
                                                namespace: str) -> None:
    app = batchq.App(cluster.url, namespace)
    queues = queues_on_nodes(cluster, namespace, prefix="per")
    for i, q in enumerate(queues):
        app.periodic(every_s=1, queue=q, name=f"beat{i}")(lambda: None)

    def ready(q: str) -> list[bytes]:
        return list(app.redis.lrange(app.keys(q).ready_for(0), 0, -1))

    async def main() -> None:
        stop = asyncio.Event()
        task = asyncio.create_task(Scheduler(app, lease_s=1.5).run(stop))
        deadline = time.monotonic() + 20
        while not all(len(ready(q)) >= 2 for q in queues):
            assert time.monotonic() < deadline and not task.done()
            await asyncio.sleep(0.05)
        stop.set()
        await task
        await app.aclose()

    try:
        asyncio.run(main())
        for i, q in enumerate(queues):
            jobs = [codec.decode_entry(e, q) for e in ready(q)]
            assert {j.task for j in jobs} == {f"beat{i}"}
            tick_ms = [j.ready_ms for j in jobs]
            assert len(set(tick_ms)) == len(tick_ms)
        status = batchq.periodic_status(app)
        assert [st["queue"] for st in status] == queues
        assert all(st["last_run_s"] and st["next_run_s"] for st in status)
    finally:
        app.close()
