"""Replica-acknowledged writes (``App(min_replicas=...)``) against a real primary with
one real replica: an enqueue returns only once the replica holds its jobs, and raises
``NotReplicated`` naming them when the replicas do not confirm in time; a worker waits
once per flush of its acks, and refuses to start when fewer replicas are present."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from fixtures.basic import *  # noqa: F403
from helpers import drop_namespace, run_cli

import batchq
from batchq.dev.server import EmbeddedServer

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def pair() -> Iterator[tuple[EmbeddedServer, EmbeddedServer]]:
    """A primary and one replica (with AOF, for WAITAOF), in sync."""
    primary = EmbeddedServer(extra_args=("--repl-diskless-sync-delay", "0")).start()
    replica = EmbeddedServer(appendonly=True, extra_args=(
        "--replicaof", "127.0.0.1", str(primary.port))).start()
    try:
        r = redis.Redis(port=primary.port)
        deadline = time.monotonic() + 30
        while "online" not in str(r.info("replication").get("slave0", {})):
            assert time.monotonic() < deadline, "replica not in sync"
            time.sleep(0.05)
        # a replica just in sync sends its first acknowledgement about a second later
        assert r.pipeline(transaction=False).set("sync", 1).execute_command(
            "WAIT", 1, 30_000).execute()[-1] == 1
        r.delete("sync")
        yield primary, replica
    finally:
        replica.stop()
        primary.stop()


@pytest.fixture
def apps(pair: tuple[EmbeddedServer, EmbeddedServer], namespace: str
         ) -> Iterator[dict[int, batchq.App]]:
    """Apps on the primary by ``min_replicas`` (0, 1, 2), one task ``job`` each."""
    made = {}
    for n in (0, 1, 2):
        a = batchq.App(pair[0].url, namespace=namespace, min_replicas=n,
                       replica_timeout_ms=200)

        @a.task(name="job")
        def job(x: int) -> None:
            pass

        made[n] = a
    yield made
    for a in made.values():
        a.close()
    drop_namespace(redis.Redis(port=pair[0].port), namespace)


def _on_replica(pair: tuple[EmbeddedServer, EmbeddedServer], app: batchq.App) -> int:
    """Jobs waiting in the default queue, as the replica sees them right now."""
    rep = redis.Redis(port=pair[1].port)
    return sum(int(rep.llen(k)) for k in rep.keys(f"*{app.namespace}*ready*") or [])


def test_enqueue_returns_once_the_replica_holds_the_jobs(pair, apps) -> None:
    a = apps[1]
    a.tasks["job"].enqueue(1)
    ids = a.tasks["job"].enqueue_many(range(25_000))  # several windows of 8 chunks
    assert len(ids) == 25_000
    # read from the replica at once: WAIT made sure it had every one of them
    assert _on_replica(pair, a) == 25_001


def test_too_few_replicas_raise_not_replicated_naming_the_jobs(pair, apps) -> None:
    task = apps[2].tasks["job"]
    with pytest.raises(batchq.NotReplicated) as err:
        task.enqueue(1)
    e = err.value
    assert len(e.ids) == 1 and (e.confirmed, e.wanted) == (1, 2)
    assert "1 of min_replicas=2" in str(e) and "has 1 connected replicas" in str(e)
    assert isinstance(e, batchq.EnqueueError)
    # the job is written: on the primary, and here on the replica too
    assert apps[0].queue("default").stats().ready == 1

    with pytest.raises(batchq.NotReplicated) as many:
        task.enqueue_many(range(2500))
    assert len(many.value.ids) == 1000 and many.value.replicated == []  # the first chunk


def test_per_call_min_replicas_overrides_the_app(apps) -> None:
    apps[2].tasks["job"].options(min_replicas=0).enqueue(1)
    apps[2].tasks["job"].options(min_replicas=1).enqueue_many(range(10))
    with pytest.raises(batchq.NotReplicated):
        apps[0].tasks["job"].options(min_replicas=2).enqueue(1)
    with pytest.raises(ValueError, match="min_replicas"):
        apps[0].tasks["job"].options(min_replicas=-1)


def test_a_stopped_replica_makes_enqueue_raise_within_the_timeout(pair, apps) -> None:
    pid = pair[1].pid
    assert pid is not None
    os.kill(pid, signal.SIGSTOP)
    try:
        t0 = time.monotonic()
        with pytest.raises(batchq.NotReplicated) as err:
            apps[1].tasks["job"].enqueue(1)
        assert err.value.confirmed == 0
        assert time.monotonic() - t0 < 10  # the 200 ms timeout, not a hang
    finally:
        os.kill(pid, signal.SIGCONT)


def test_asyncio_enqueues_wait_too_and_each_caller_gets_its_ids(pair, apps) -> None:
    async def main() -> None:
        ok = apps[1].tasks["job"]
        await ok.aenqueue(1)
        assert len(await ok.aenqueue_many(range(9000))) == 9000
        short = apps[2].tasks["job"]
        got = await asyncio.gather(*(short.aenqueue(i) for i in range(20)),
                                   return_exceptions=True)
        assert all(isinstance(g, batchq.NotReplicated) for g in got), got
        ids = [g.ids for g in got if isinstance(g, batchq.NotReplicated)]
        assert all(len(i) == 1 for i in ids) and len({i[0] for i in ids}) == 20
        with pytest.raises(batchq.NotReplicated):
            await short.aenqueue_many(range(3000))
    asyncio.run(main())
    assert _on_replica(pair, apps[1]) >= 9001


def test_replica_fsync_waits_for_the_replica_aof(pair, namespace) -> None:
    # appendfsync everysec: the replica's fsync may be up to a second away, more on a busy
    # machine; the test is about confirming, not about how fast
    a = batchq.App(pair[0].url, namespace=namespace, min_replicas=1, replica_fsync=True,
                   replica_timeout_ms=15_000)

    @a.task(name="job")
    def job(x: int) -> None:
        pass

    job.enqueue(1)  # the replica runs with appendonly yes: WAITAOF confirms
    with pytest.raises(ValueError, match="replica_timeout_ms"):
        batchq.App(pair[0].url, min_replicas=1, replica_timeout_ms=0)
    with pytest.raises(ValueError, match="min_replicas"):
        batchq.App(pair[0].url, min_replicas=True)  # type: ignore[arg-type]


def test_min_replicas_on_a_cluster_is_refused() -> None:
    with pytest.raises(ValueError, match="Cluster"):
        batchq.App("redis+cluster://127.0.0.1:7000", min_replicas=1)


def _worker(pair, namespace: str, runs: Path, n: int, *flags: str
            ) -> subprocess.CompletedProcess[str]:
    return run_cli(["worker", "apps.fault_app:app", *flags],
                   env={"BATCHQ_REDIS_URL": pair[0].url, "FAULT_NS": namespace,
                        "FAULT_RUNS": str(runs), "FAULT_MIN_REPLICAS": str(n)}, timeout_s=60)


def test_worker_with_more_min_replicas_than_present_refuses_to_start(pair, namespace,
                                                                     tmp_path) -> None:
    res = _worker(pair, namespace, tmp_path, 2, "--burst")
    assert res.returncode == 4, res.stderr
    assert "min_replicas=2" in res.stderr and "has 1 connected replicas" in res.stderr
    assert "Traceback" not in res.stderr


def test_worker_with_min_replicas_drains(pair, namespace, tmp_path) -> None:
    from apps.fault_app import build

    a = build(pair[0].url, namespace, None, min_replicas=1)
    a.tasks["work"].enqueue_many([(f"t{i}", 0) for i in range(300)])
    res = _worker(pair, namespace, tmp_path, 1, "--burst", "-c", "20")
    assert res.returncode == 0, res.stderr[-3000:]
    done = sum(line.startswith("E ") for f in tmp_path.glob("runs-*.log")
               for line in f.read_text().splitlines())
    assert done == 300
    acks = redis.Redis(port=pair[0].port).info("commandstats").get("cmdstat_wait", {})
    assert acks.get("calls", 0) >= 1  # one WAIT per flush of acks, not per job
    assert acks.get("calls", 0) < 300
    a.close()


def test_not_replicated_jobs_retried_with_their_dedup_key_are_not_doubled(apps) -> None:
    with pytest.raises(batchq.NotReplicated) as err:
        apps[2].tasks["job"].options(key="once").enqueue(1)
    again = apps[1].tasks["job"].options(key="once").enqueue(1)  # the retry: confirmed
    assert again == err.value.ids[0]
    assert apps[0].queue("default").stats().ready == 1
