"""Bundles (``_lib.lua`` "Bundles") on a real 3-master cluster: every script that takes a
bundle job (pop, ack, nack, release, extend, status, the reaper) on queues whose keys
live on three different nodes; and a worker's drain that leases in bundles."""

from __future__ import annotations

import signal
import time
from collections import Counter
from pathlib import Path

import pytest
from fixtures.cluster import *  # noqa: F403
from fixtures.cluster import WorkerFactory, queues_on_nodes, read_runs

import batchq
from batchq.dev.cluster import EmbeddedCluster
from batchq.store.scripts import calls
from batchq.store.scripts.replies import decode_pop_reply

pytestmark = [pytest.mark.integration, pytest.mark.cluster, pytest.mark.timeout(120)]


def test_bundle_scripts_on_three_nodes(cluster: EmbeddedCluster, app: batchq.App) -> None:
    s = app.sync_scripts
    for q in queues_on_nodes(cluster, app.namespace, prefix="bun"):
        k = app.keys(q)
        ids = app.tasks["rec"].options(queue=q).enqueue_many([f"{q}-{i}" for i in range(6)])
        res = decode_pop_reply(s.call(calls.pop(k, 6, 30_000, 100, bundle=True)))
        name, n = res.bundle
        assert n == 6 and len(res.jobs) == 6
        lease = [name + p.to_bytes(2, "big") for p in range(1, 7)]
        assert app.job_status(ids[2]) == "reserved"
        assert app.queue(q).stats().reserved == 6
        assert s.call(calls.extend(k, 60_000, lease[:2])) == []
        assert s.call(calls.ack(k, lease[:2])) == []
        assert s.call(calls.nack(k, retries=[(lease[2], 60_000)])) == []
        assert s.call(calls.release(k, lease[3:5])) == 2
        assert app.queue(q).stats().reserved == 1
        # the last one's worker "died": its bundle expires and the reaper takes it back
        app.redis.zadd(k.bundles, {name: 1})
        assert int(s.call(calls.pop(k, 0, 30_000, 100, bundle=True))[4]) == 1
        assert not any(app.redis.exists(x) for x in (k.reserved, k.bundles, k.inflight))
        st = app.queue(q).stats()
        assert (st.ready, st.delayed, st.reserved) == (3, 1, 0)
        assert app.job_status(ids[5]) == "ready" and app.job_status(ids[2]) == "delayed"


def test_a_drain_in_bundles_on_cluster(cluster: EmbeddedCluster, app: batchq.App,
                                       start_worker: WorkerFactory, log_path: Path) -> None:
    qa, qb, qc = queues_on_nodes(cluster, app.namespace, prefix="bdr")
    tokens = {q: [f"{q}-{i}" for i in range(1500)] for q in (qa, qb, qc)}
    for q, toks in tokens.items():
        app.tasks["rec"].options(queue=q).enqueue_many(toks)
    worker = start_worker([qa, qb, qc], "-c", "200")
    want = {t for toks in tokens.values() for t in toks}
    deadline = time.monotonic() + 60
    while {t for _, t, _, _ in read_runs(log_path, "rec")} < want:
        assert time.monotonic() < deadline, "the drain did not finish"
        time.sleep(0.1)
    counts = Counter(t for _, t, _, _ in read_runs(log_path, "rec"))
    assert set(counts.values()) == {1}
    for q in (qa, qb, qc):
        k = app.keys(q)
        assert int(app.redis.hget(k.stats, "bseq") or 0) > 0  # it did lease bundles
        assert int(app.redis.hget(k.stats, "succeeded")) == 1500
        assert app.redis.hget(k.stats, "bundled") == b"0"
    assert worker.stop(signal.SIGTERM, timeout_s=20) == 0
