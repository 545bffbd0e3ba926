"""``batchq.dev.cluster.EmbeddedCluster``: start, slot layout, migration, clean stop."""

from __future__ import annotations

import itertools
import os
from pathlib import Path

import pytest
import redis.cluster
from fixtures.cluster import *  # noqa: F403

from batchq.dev.cluster import CLUSTER_SLOTS, EmbeddedCluster

pytestmark = [pytest.mark.integration, pytest.mark.cluster]


def test_slot_ranges_cover_every_slot_once() -> None:
    for n in (1, 2, 3, 5):
        ranges = EmbeddedCluster(n).slot_ranges()
        assert ranges[0][0] == 0 and ranges[-1][1] == CLUSTER_SLOTS - 1
        assert all(a[1] + 1 == b[0] for a, b in itertools.pairwise(ranges))
    with pytest.raises(ValueError):
        EmbeddedCluster(0)


def test_not_started() -> None:
    c = EmbeddedCluster()
    with pytest.raises(RuntimeError):
        _ = c.url
    assert not c.is_running()
    c.stop()  # harmless


def test_start_migrate_stop() -> None:
    c = EmbeddedCluster(2).start()
    try:
        assert c.is_running() and len(set(c.ports)) == 2
        assert c.url == f"redis+cluster://127.0.0.1:{c.ports[0]}"
        rc = redis.cluster.RedisCluster(host="127.0.0.1", port=c.ports[0])
        try:
            assert len(rc.get_primaries()) == 2
            key = "{tag}:k"
            slot = rc.keyslot(key)
            rc.set(key, "v")
            src = c.slot_owner(slot)
            assert c.migrate_slot(slot, 1 - src) == 1
            assert c.slot_owner(slot) == 1 - src
            assert rc.get(key) == b"v"  # the client follows the MOVED reply
            assert c.migrate_slot(slot, 1 - src) == 0  # already there
        finally:
            rc.close()
        pids = [n.pid for n in c.nodes]
        dirs = [n.dir for n in c.nodes]
        assert all(os.path.exists(Path(d) / "nodes.conf") for d in dirs)
    finally:
        c.stop()
    assert not c.nodes
    for pid, d in zip(pids, dirs, strict=True):
        assert not Path(f"/proc/{pid}").exists()  # stopped and reaped
        assert not os.path.exists(d)


def test_a_node_that_cannot_start_fails_the_start() -> None:
    c = EmbeddedCluster(2, extra_args=["--no-such-option", "x"])
    with pytest.raises(RuntimeError, match="cannot start a cluster node"):
        c.start(timeout_s=10)
    assert not c.nodes
