"""``batchq bench load`` on a Redis Cluster: two producer processes, a worker, and the
run's keys (one hash tag of the run) merged and read back through cluster clients."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import redis
from fixtures.cluster import *  # noqa: F403
from redis.crc import key_slot

from batchq.dev.cluster import EmbeddedCluster
from batchq.store.keys import load_keys

pytestmark = [pytest.mark.e2e, pytest.mark.cluster]

REPO = Path(__file__).resolve().parent.parent.parent
APP = "bench.loadtest.app:app"


def test_load_run_on_a_cluster(cluster: EmbeddedCluster) -> None:
    ns = f"lt{uuid.uuid4().hex[:8]}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("BATCHQ_")}
    env.update(BATCHQ_REDIS_URL=cluster.url, LOADTEST_NS=ns,
               PYTHONPATH=os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]))
    worker = subprocess.Popen(
        [sys.executable, "-m", "batchq", "worker", APP, "-c", "50", "--no-metrics",
         "--log-level", "WARNING"], cwd=REPO, env=env, stdin=subprocess.DEVNULL)
    run_id = f"c-{uuid.uuid4().hex[:6]}"
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "batchq", "bench", "load", APP, "flaky", "--rate", "200",
             "--duration", "1.5", "--args", "[3]", "--producers", "2", "--run-id", run_id,
             "--json"], cwd=REPO, env=env, capture_output=True, text=True, timeout=120,
            stdin=subprocess.DEVNULL)
    finally:
        worker.terminate()
        worker.wait(timeout=30)
    assert proc.returncode == 0, proc.stderr
    r = json.loads(proc.stdout)
    assert r["sent"] == 300 and r["errors"] == 100
    assert r["errors_by_type"]["ValueError"]["count"] == 100
    keys = load_keys(ns, run_id)
    slots = {key_slot(k.encode()) for k in (keys.meta, keys.sum, keys.timeline)}
    assert len(slots) == 1  # one slot: the scripts are Cluster-legal
    node = cluster.slot_owner(slots.pop())
    direct = redis.Redis.from_url(cluster.node_url(node))
    assert int(direct.hget(keys.sum, "done") or 0) == 300
    assert 0 < direct.pttl(keys.sum) <= 86_400_000
