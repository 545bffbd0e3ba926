"""Circuit breakers, fallback re-routes and replace / debounce on a 3-master Redis
Cluster: each breaker's keys share its own hash tag (any node), reroute.lua and
enqueue_tracked.lua stay within their queue's slot."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from apps.sendctl_app import build
from fixtures.cluster import *  # noqa: F403
from fixtures.cluster import queues_on_nodes
from fixtures.runs import read_runs
from helpers import wait_until
from redis.crc import key_slot

import batchq
from batchq.dev.cluster import EmbeddedCluster
from batchq.flow.breaker import BreakerOpen

pytestmark = [pytest.mark.integration, pytest.mark.cluster]


@pytest.fixture
def sapp(cluster: EmbeddedCluster, namespace: str, tmp_path: Path) -> Iterator[batchq.App]:
    a = build(cluster.url, namespace, str(tmp_path / "runs.log"))
    yield a
    a.close()


def _burst(app: batchq.App, queue: str) -> None:
    s = batchq.WorkerSettings(queues=(queue,), burst=True, install_signal_handlers=False,
                              metrics=False, concurrency=8)
    asyncio.run(batchq.Worker(app, s).run())


def test_breaker_scripts_on_breakers_of_three_nodes(cluster: EmbeddedCluster,
                                                    sapp: batchq.App) -> None:
    names, nodes = [], set()
    i = 0
    while len(nodes) < 3:  # one breaker per node
        name = f"b{i}"
        node = cluster.slot_owner(int(key_slot(f"{{{sapp.namespace}:breaker:{name}}}"
                                               .encode())))
        if node not in nodes:
            nodes.add(node)
            names.append(name)
        i += 1
    for name in names:
        sapp.breaker(name, failures=3, within_s=30, open_s=0.3, half_open_jobs=2)
        for _ in range(3):
            with pytest.raises(ConnectionError), sapp.breaker(name):
                raise ConnectionError("down")
        b = sapp.breakers[name]
        assert (b.state().state, b.state().trips) == ("open", 1)
        with pytest.raises(BreakerOpen), sapp.breaker(name):
            pass
        wait_until(lambda b=b: b.state().state == "half_open", timeout_s=10)
        b._open_until = 0.0  # what this process saw: over

        async def probes(name: str = name) -> None:
            async with sapp.breaker(name):
                pass
            async with sapp.breaker(name):
                pass

        asyncio.run(probes())
        assert b.state().state == "closed"
        b.open(60)
        assert b.state().state == "open"
        assert b.close() == ("open", pytest.approx(60, abs=2))


def test_reroute_and_replace_on_each_node(cluster: EmbeddedCluster,
                                          sapp: batchq.App, tmp_path: Path) -> None:
    qs = queues_on_nodes(cluster, sapp.namespace, prefix="brk")
    sapp.breakers["prov"].open(60)
    routed = sapp.tasks["routed"]
    for q in qs:
        routed.options(queue=q).enqueue_many([f"{q}-{i}" for i in range(10)])
        first = routed.options(queue=q, key="k", on_conflict="replace").enqueue(f"{q}-k1")
        assert routed.options(queue=q, key="k", on_conflict="replace").enqueue(
            f"{q}-k2") == first
        deb = routed.options(queue=q, key="d", delay_s=0.2, on_conflict="debounce")
        jid = deb.enqueue(f"{q}-d1")
        assert deb.enqueue(f"{q}-d2") == jid
    time.sleep(0.3)  # the debounced jobs are due
    for q in qs:
        _burst(sapp, q)
    runs = read_runs(tmp_path / "runs.log")
    assert sorted(r.token for r in runs if r.kind == "backup") == sorted(
        [f"{q}-{i}" for q in qs for i in range(10)] + [f"{q}-k2" for q in qs]
        + [f"{q}-d2" for q in qs])
    assert not [r for r in runs if r.kind != "backup"]
    for q in qs:
        assert int(sapp.redis.hget(sapp.keys(q).stats, "rerouted:routed")) == 12
