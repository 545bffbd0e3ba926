"""batchq on a real 3-master Redis Cluster (embedded Valkey): the cluster clients, scripts
and pipelines over queues on different nodes, and real ``batchq worker`` processes
(single and ``-p 2``) serving queues whose keys live on different nodes, the operator
CLI, and a slot resharding while a worker runs."""

from __future__ import annotations

import asyncio
import json
import signal
import threading
import time
from collections import Counter
from pathlib import Path

import pytest
import redis
import redis.asyncio.cluster
import redis.asyncio.connection
import redis.cluster
from fixtures.cluster import *  # noqa: F403
from fixtures.cluster import WorkerFactory, node_client, queue_slot, queues_on_nodes, read_runs
from helpers import run_cli, wait_until

import batchq
from batchq.dev.cluster import EmbeddedCluster
from batchq.ops.metrics import QueueCollector
from batchq.store.connection import RedisSettings, is_cluster_url, packing, plain_url, redact
from batchq.store.scripts import calls, run_pipeline
from batchq.store.scripts.replies import decode_pop_reply

pytestmark = [pytest.mark.integration, pytest.mark.cluster, pytest.mark.timeout(120)]

# --- clients ------------------------------------------------------------------------------


def test_cluster_urls_select_cluster_clients(cluster: EmbeddedCluster) -> None:
    assert is_cluster_url("redis+cluster://h:1") and is_cluster_url("REDISS+CLUSTER://h:1")
    assert not is_cluster_url("redis://h:1/0") and not is_cluster_url("rediss://h:1/0")
    assert plain_url("rediss+cluster://u:p@h:1?ssl_ca_certs=/ca.pem") == \
        "rediss://u:p@h:1?ssl_ca_certs=/ca.pem"
    assert plain_url("redis://h:1/0") == "redis://h:1/0"
    assert redact("redis+cluster://u:hunter22@h:1") == "redis+cluster://u:***@h:1"

    s = RedisSettings(cluster.url)
    assert s.cluster and not RedisSettings("redis://h:1/0").cluster
    sync = s.sync_client()
    try:
        assert isinstance(sync, redis.cluster.RedisCluster)
        assert len(sync.get_primaries()) == 3  # one seed, every node discovered
        # every node's client packs with hiredis, and so do the ones discovered later
        fast = packing(redis.connection.Connection)
        for node in sync.get_nodes():
            assert node.redis_connection.connection_pool.connection_class is fast
        assert sync.nodes_manager.connection_kwargs["connection_class"] is fast
        sync.set("{packing}:k", "é")
        assert sync.get("{packing}:k") == "é".encode()
        sync.delete("{packing}:k")
    finally:
        sync.close()
    aclient = s.async_client()
    assert isinstance(aclient, redis.asyncio.cluster.RedisCluster)

    async def every_node_packs_with_hiredis() -> None:
        # the seed node and the nodes discovered later (a real command initializes)
        await aclient.set("{packing}:k", "é")
        assert await aclient.get("{packing}:k") == "é".encode()
        nodes = aclient.get_nodes()
        assert len(nodes) == 3
        for node in nodes:
            assert node.connection_class is packing(redis.asyncio.connection.Connection)
        await aclient.delete("{packing}:k")
        await aclient.aclose()

    asyncio.run(every_node_packs_with_hiredis())

    # TLS options of the URL reach the connections (the client is lazy: nothing dials)
    tls = RedisSettings("rediss+cluster://127.0.0.1:1?ssl_ca_certs=/ca.pem"
                        "&ssl_cert_reqs=required&ssl_certfile=/c.pem&ssl_keyfile=/k.pem")
    ac = tls.async_client()
    kw = ac.connection_kwargs
    assert kw["connection_class"] is packing(redis.asyncio.connection.SSLConnection)
    assert tls.cluster  # the sync client dials its seed at once: only the class is checked
    assert issubclass(packing(redis.connection.SSLConnection), redis.connection.SSLConnection)
    assert (kw["ssl_ca_certs"], kw["ssl_certfile"], kw["ssl_keyfile"]) == \
        ("/ca.pem", "/c.pem", "/k.pem")


def test_queues_spread_over_nodes(cluster: EmbeddedCluster, namespace: str) -> None:
    names = queues_on_nodes(cluster, namespace)
    owners = [cluster.slot_owner(queue_slot(namespace, q)) for q in names]
    assert owners == [0, 1, 2]
    app = batchq.App(cluster.url, namespace)
    try:
        for i, q in enumerate(names):
            app.queue(q).pause()
            r = node_client(cluster, i)
            try:  # the key is on its node (a plain client would get MOVED elsewhere)
                assert r.exists(app.keys(q).paused) == 1
            finally:
                r.close()
    finally:
        app.close()


def test_scripts_and_pipelines_reload_after_script_flush(cluster: EmbeddedCluster,
                                                         app: batchq.App) -> None:
    qs = queues_on_nodes(cluster, app.namespace)
    rec = app.tasks["rec"]
    for q in qs:
        assert len(rec.options(queue=q).enqueue_many(range(10))) == 10

    def flush_scripts() -> None:
        for i in range(3):
            r = node_client(cluster, i)
            r.script_flush()
            r.close()

    # a pipeline spanning the three nodes: every EVALSHA hits NOSCRIPT and is re-run
    flush_scripts()
    pipe = app.redis.pipeline(transaction=False)
    for q in qs:
        k = app.keys(q)
        app.sync_scripts.call(calls.pop(k, 4, 30_000, 100), client=pipe)
    results = run_pipeline(pipe, app.redis)
    assert [len(decode_pop_reply(r).jobs) for r in results] == [4, 4, 4], results

    # enqueue_many windows (several chunks: pipelined) and a lone call, sync and async
    flush_scripts()
    assert len(rec.options(queue=qs[0]).enqueue_many(range(2500))) == 2500
    flush_scripts()
    rec.options(queue=qs[1]).enqueue("one")

    async def aio() -> None:
        flush_scripts()
        ids = await rec.options(queue=qs[2]).aenqueue_many(range(2500))
        assert len(ids) == 2500
        flush_scripts()
        await rec.options(queue=qs[2]).aenqueue("two")
        await app.aclose()

    asyncio.run(aio())
    ready = [app.queue(q).stats().ready for q in qs]
    assert ready == [6 + 2500, 6 + 1, 6 + 2501]


# --- workers ------------------------------------------------------------------------------


def _blpop_clients(cluster: EmbeddedCluster) -> list[int]:
    """How many clients are blocked in BLPOP on each node."""
    out = []
    for i in range(3):
        r = node_client(cluster, i)
        try:
            out.append(sum(1 for c in r.client_list()
                           if c.get("cmd") == "blpop" and "b" in c.get("flags", "")))
        finally:
            r.close()
    return out


def _cli(cluster: EmbeddedCluster, namespace: str, *args: str) -> tuple[int, str, str]:
    env = {"BATCHQ_REDIS_URL": cluster.url, "BATCHQ_NAMESPACE": namespace}
    p = run_cli(list(args), env=env, timeout_s=60)
    return p.returncode, p.stdout, p.stderr


def test_worker_serves_queues_on_three_nodes(cluster: EmbeddedCluster, app: batchq.App,
                                             start_worker: WorkerFactory, log_path: Path,
                                             flag_path: Path) -> None:
    qa, qb, qc = queues_on_nodes(cluster, app.namespace)
    rec, flaky = app.tasks["rec"], app.tasks["flaky"]
    # while no worker runs: priorities in qa, a big batch in qb, async writes and a sync
    # task in qc, a delayed job, and jobs that fail until fixed
    rec.options(queue=qa, priority=0).enqueue_many([f"L{i}" for i in range(5)])
    rec.options(queue=qa, priority=9).enqueue_many([f"H{i}" for i in range(5)])
    rec.options(queue=qb).enqueue_many([f"b{i}" for i in range(2500)])

    async def aio() -> None:
        await rec.options(queue=qc).aenqueue_many([f"c{i}" for i in range(1500)])
        await rec.options(queue=qc).aenqueue("c-single")
        await app.aclose()

    asyncio.run(aio())
    app.tasks["sync_rec"].options(queue=qc).enqueue("s0")
    flaky.options(queue=qb).enqueue_many(["F0", "F1"])
    enqueued_at = time.time()
    rec.options(queue=qc, delay_s=1.0).enqueue("delayed")

    worker = start_worker([qa, qb, qc], "-c", "1")
    expected = {f"L{i}" for i in range(5)} | {f"H{i}" for i in range(5)} \
        | {f"b{i}" for i in range(2500)} | {f"c{i}" for i in range(1500)} \
        | {"c-single", "delayed"}

    def done() -> bool:
        return {t for _, t, _, _ in read_runs(log_path, "rec")} >= expected and \
            app.queue(qb).stats().dead == 2
    wait_until(done, timeout_s=30, interval_s=0.1, message="jobs did not all run")

    runs = read_runs(log_path)
    counts = Counter(t for k, t, _, _ in runs if k == "rec")
    assert set(counts.values()) == {1}, [t for t, n in counts.items() if n > 1][:10]
    assert [t for _, t, _, _ in read_runs(log_path, "sync_rec")] == ["s0"]
    qa_order = [t for _, t, _, _ in read_runs(log_path, "rec") if t[0] in "HL"]
    assert qa_order == [f"H{i}" for i in range(5)] + [f"L{i}" for i in range(5)]
    delayed_t = next(t for _, tok, _, t in runs if tok == "delayed")
    assert delayed_t >= enqueued_at + 1.0 - 0.01
    assert Counter(t for k, t, _, _ in runs if k == "flaky") == {"F0": 3, "F1": 3}

    # idle: one BLPOP per queue, each on the node holding that queue's wake list
    wait_until(lambda: _blpop_clients(cluster) == [1, 1, 1], timeout_s=10,
               message="expected one blocked BLPOP per node")
    for q in (qc, qa, qb):  # an enqueue to any queue wakes the idle worker at once
        t0 = time.monotonic()
        rec.options(queue=q).enqueue(f"wake-{q}")
        wait_until(lambda q=q: any(t == f"wake-{q}" for _, t, _, _ in
                                   read_runs(log_path, "rec")), timeout_s=5)
        assert time.monotonic() - t0 < 1.0

    # the operator CLI against the cluster
    code, out, err = _cli(cluster, app.namespace, "info", "--json")
    assert code == 0, err
    info = json.loads(out)
    assert set(info["queues"]) >= {qa, qb, qc}
    assert info["queues"][qb]["dead"] == 2
    assert all(info["queues"][q]["ready"] == 0 for q in (qa, qb, qc))
    assert [w["queues"] for w in info["workers"]] == [f"{qa},{qb},{qc}"]
    code, out, err = _cli(cluster, app.namespace, "check")
    assert code == 0 and out.startswith("ok:"), (out, err)
    code, out, err = _cli(cluster, app.namespace, "dead", "list", qb, "--json")
    assert code == 0, err
    assert sorted(j["task"] for j in json.loads(out)["jobs"]) == ["flaky", "flaky"]

    # metrics read every queue in one pipeline spanning the nodes
    fams = {m.name: m for m in QueueCollector(app).collect()}
    assert [s.value for s in fams["batchq_redis_up"].samples] == [1]
    dead = {s.labels["queue"]: s.value for s in fams["batchq_queue_jobs"].samples
            if s.labels["state"] == "dead"}
    assert dead[qb] == 2

    # pause / resume (same-slot keys) and retry of the dead jobs once they are fixed
    code, _, err = _cli(cluster, app.namespace, "pause", qa)
    assert code == 0, err
    rec.options(queue=qa).enqueue("while-paused")
    time.sleep(0.5)
    assert "while-paused" not in {t for _, t, _, _ in read_runs(log_path, "rec")}
    code, _, err = _cli(cluster, app.namespace, "resume", qa)
    assert code == 0, err
    wait_until(lambda: "while-paused" in {t for _, t, _, _ in read_runs(log_path, "rec")},
               timeout_s=5)
    flag_path.touch()
    code, out, err = _cli(cluster, app.namespace, "dead", "retry", qb, "--all")
    assert code == 0 and "retried 2" in out, (out, err)
    wait_until(lambda: sorted(t for _, t, _, _ in read_runs(log_path, "fixed"))
               == ["F0", "F1"], timeout_s=10)
    assert app.queue(qb).stats().dead == 0

    assert worker.stop(signal.SIGTERM, timeout_s=20) == 0
    log = worker.read_log()
    for bad in ("Traceback", "CROSSSLOT", "blocking wait failed", "fetch failed"):
        assert bad not in log, log
    code, out, _ = _cli(cluster, app.namespace, "info", "--json")
    assert json.loads(out)["workers"] == []


def test_two_worker_processes_on_cluster(cluster: EmbeddedCluster, app: batchq.App,
                                         start_worker: WorkerFactory, log_path: Path,
                                         flag_path: Path) -> None:
    qs = queues_on_nodes(cluster, app.namespace)
    rec = app.tasks["rec"]
    for q in qs:
        rec.options(queue=q).enqueue_many([f"{q}-{i}" for i in range(1000)])
        rec.options(queue=q, priority=3, delay_s=0.3).enqueue_many(
            [f"{q}-delayed-{i}" for i in range(20)])
    app.tasks["flaky"].options(queue=qs[2]).enqueue_many(["F0", "F1"])
    sup = start_worker(qs, "-p", "2", "-c", "20", "--metrics-port", "0", serving=2)
    for q in qs:  # and while they run
        rec.options(queue=q).enqueue_many([f"{q}-late-{i}" for i in range(200)])
    expected = {f"{q}-{i}" for q in qs for i in range(1000)} | \
        {f"{q}-late-{i}" for q in qs for i in range(200)} | \
        {f"{q}-delayed-{i}" for q in qs for i in range(20)}
    wait_until(lambda: {t for _, t, _, _ in read_runs(log_path, "rec")} >= expected
               and app.queue(qs[2]).stats().dead == 2,
               timeout_s=30, interval_s=0.1, message="jobs did not all run")
    counts = Counter(t for _, t, _, _ in read_runs(log_path, "rec"))
    assert set(counts.values()) == {1}
    assert len(counts) == len(expected)
    assert Counter(t for _, t, _, _ in read_runs(log_path, "flaky")) == {"F0": 3, "F1": 3}
    flag_path.touch()
    assert app.queue(qs[2]).retry_dead() == 2
    wait_until(lambda: sorted(t for _, t, _, _ in read_runs(log_path, "fixed"))
               == ["F0", "F1"], timeout_s=10)
    for q in qs:
        wait_until(lambda q=q: app.queue(q).stats().pending == 0, timeout_s=10)
        st = app.queue(q).stats()
        assert (st.ready, st.delayed, st.reserved, st.dead) == (0, 0, 0, 0)
    assert sup.stop(signal.SIGTERM, timeout_s=30) == 0
    log = sup.read_log()
    assert "Traceback" not in log and log.count(" exited (0)") == 2, log


def test_resharding_a_queue_slot_while_a_worker_runs(cluster: EmbeddedCluster,
                                                     app: batchq.App,
                                                     start_worker: WorkerFactory,
                                                     log_path: Path) -> None:
    """The slot of a busy queue moves to another node (IMPORTING/MIGRATING, MIGRATE key by
    key, SETSLOT NODE) while a worker pops, acks and blocks on it and a producer writes
    to it: jobs may run twice, none is lost."""
    qa, qb, _ = queues_on_nodes(cluster, app.namespace, prefix="r")
    slot = queue_slot(app.namespace, qa)
    assert cluster.slot_owner(slot) == 0
    slow = app.tasks["slow"]
    # more keys in the slot: dead letters, delayed jobs; and a worker slower than the
    # producer, so ready, reserved and in-flight entries exist while the slot moves
    app.tasks["flaky"].options(queue=qa).enqueue_many(["F0", "F1", "F2"])
    slow.options(queue=qa, delay_s=1.5).enqueue_many([(f"d{i}", 0.0) for i in range(50)])
    worker = start_worker([qa, qb], "-c", "5", "--fetch-batch", "10")
    wait_until(lambda: app.queue(qa).stats().dead == 3, timeout_s=10)

    written: list[str] = []
    errors: list[BaseException] = []
    stop = threading.Event()

    def produce() -> None:
        task = slow.options(queue=qa)
        n = 0
        try:
            while not stop.is_set():
                batch = [(f"j{n + i}", 0.02) for i in range(20)]
                for _ in range(200):
                    try:
                        task.enqueue_many(batch)
                        break
                    except (redis.exceptions.TryAgainError, redis.exceptions.ClusterError):
                        # the slot is half-moved (TRYAGAIN until redis-py gives up with
                        # "TTL exhausted"): the script did not run; try again
                        time.sleep(0.05)
                else:
                    raise AssertionError("enqueue kept failing")
                written.extend(t for t, _ in batch)
                n += 20
                time.sleep(0.04)
        except BaseException as exc:
            errors.append(exc)

    producer = threading.Thread(target=produce, name="producer")
    producer.start()
    try:
        wait_until(lambda: len(read_runs(log_path, "slow")) > 100, timeout_s=10)
        before = app.queue(qa).stats()
        assert before.ready and before.reserved and before.delayed, before
        moved = cluster.migrate_slot(slot, 2, batch=1, pause_s=0.1)
        # some of: ready, delayed, reserved, inflight, dead, dead:jobs, stats, wake
        assert moved >= 4, moved
        assert cluster.slot_owner(slot) == 2
        time.sleep(0.3)  # keep producing onto the new owner
    finally:
        stop.set()
        producer.join(timeout=30)
    assert not errors, errors
    expected = set(written) | {f"d{i}" for i in range(50)}
    wait_until(lambda: {t for _, t, _, _ in read_runs(log_path, "slow")} >= expected,
               timeout_s=30, interval_s=0.1, message="jobs are missing")
    runs = Counter(t for _, t, _, _ in read_runs(log_path, "slow"))
    assert set(runs) == expected  # every job ran, none is unknown
    st = app.queue(qa).stats()
    assert (st.ready, st.delayed, st.reserved, st.dead) == (0, 0, 0, 3), st
    r = node_client(cluster, 2)  # the queue's keys now live on node 2
    assert r.execute_command("CLUSTER", "COUNTKEYSINSLOT", slot) >= 1
    # the worker still serves the queue on its new node
    slow.options(queue=qa).enqueue("after", 0.0)
    wait_until(lambda: "after" in {t for _, t, _, _ in read_runs(log_path, "slow")},
               timeout_s=10)
    assert worker.stop(signal.SIGTERM, timeout_s=20) == 0
    assert "Traceback" not in worker.read_log(), worker.read_log()
    # dead letters moved with the slot; purge by id (MULTI/EXEC in the slot) and all
    q = app.queue(qa)
    assert q.purge_dead(q.dead_ids(limit=1)) == 1
    assert q.purge_dead() == 2
    q.clear()  # one DEL of every key of the queue; the job sequence counter stays (keys.py)
    left = r.execute_command("CLUSTER", "GETKEYSINSLOT", slot, 10)
    assert [x.decode() if isinstance(x, bytes) else x for x in left] == [app.keys(qa).seq]
    r.close()

