"""``batchq.BatchingRedis`` in real worker processes (tests/apps/handler_redis_app.py):
a handle made at import is used by each pre-forked child on a connection of its own,
the commands of the jobs a worker runs at once share round trips, an error reply fails
only the job that sent it, and a connection killed mid-batch raises in the handlers
whose commands were on it, whose jobs then retry."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import redis
from apps import handler_redis_app as hr
from helpers import drop_namespace, wait_until
from workers import WorkerProcs, worker_env

import batchq

pytestmark = pytest.mark.integration

APP_REF = "apps.handler_redis_app:app"
CLIENT_NAME = "batchq-test-handler"


@pytest.fixture
def app(redis_url: str, namespace: str, redis_client: redis.Redis) -> Iterator[batchq.App]:
    a = hr.build(redis_url, namespace)  # the workers' app, in this process
    yield a
    a.close()
    drop_namespace(redis_client, namespace)
    for k in redis_client.scan_iter(f"{namespace}:h:*"):
        redis_client.delete(k)


@pytest.fixture
def procs(redis_url: str, namespace: str) -> Iterator[WorkerProcs]:
    env = worker_env({"BATCHQ_REDIS_URL": redis_url, "BATCHQ_TEST_NS": namespace,
                      "BATCHQ_TEST_HANDLER_URL": redis_url})
    with WorkerProcs(APP_REF, env) as p:
        yield p


def key(namespace: str, name: str) -> str:
    return f"{namespace}:h:{name}"


def test_children_batch_on_their_own_connections(app: batchq.App, procs: WorkerProcs,
                                                 redis_client: redis.Redis,
                                                 namespace: str) -> None:
    jobs = 600
    # both children serve (idle, each blocked on its pop) before the jobs come
    proc = procs.start("-q", hr.QUEUE, "-p", "2", "-c", "50", serving=2)
    app.tasks["visit"].enqueue_many((i,) for i in range(jobs))
    wait_until(lambda: int(redis_client.get(key(namespace, "visits")) or 0) == jobs
               and redis_client.llen(key(namespace, "conns")) == jobs, timeout_s=60,
               message=proc.read_log()[-3000:])
    conns: dict[str, set[str]] = {}
    for entry in redis_client.lrange(key(namespace, "conns"), 0, -1):
        pid, _, client = entry.decode().partition(":")
        conns.setdefault(pid, set()).add(client)
    # every child that ran jobs used one connection, its own
    assert len(conns) == 2, conns
    assert all(len(c) == 1 for c in conns.values()), conns
    assert len(set.union(*conns.values())) == 2
    # 3 calls a job (1,800 in all): one round trip each without sharing
    trips = sum(int(v) for v in redis_client.hvals(key(namespace, "trips")))
    assert trips < 3 * jobs / 4, trips


def test_error_reply_fails_only_its_job(app: batchq.App, procs: WorkerProcs,
                                        redis_client: redis.Redis, namespace: str) -> None:
    bad = {"n3", "n11"}
    for name in bad:
        redis_client.set(key(namespace, name), "text")
    app.tasks["bump"].enqueue_many((f"n{i}",) for i in range(20))
    proc = procs.start("-q", hr.QUEUE, "-c", "20", "--burst", serving=0)
    assert proc.wait(timeout=60) == 0, proc.read_log()
    for i in range(20):
        name = f"n{i}"
        got = redis_client.get(key(namespace, name))
        assert got == (b"text" if name in bad else b"1"), (name, got)
    queue = app.queue(hr.QUEUE)
    assert queue.stats().dead == 2
    reasons = [d.error_message for d in queue.dead_jobs()]
    assert all("WRONGTYPE" in str(e) or "not an integer" in str(e) for e in reasons), reasons


def test_connection_lost_mid_batch_jobs_retry(app: batchq.App, procs: WorkerProcs,
                                              redis_client: redis.Redis,
                                              namespace: str) -> None:
    jobs = 10
    app.tasks["hold"].enqueue_many((f"t{i}",) for i in range(jobs))
    proc = procs.start("-q", hr.QUEUE, "-c", "20")
    killed: list[Any] = []

    def blocked_killed_or_done() -> bool:
        for c in redis_client.client_list():
            if c.get("name") == CLIENT_NAME and c.get("cmd") == "blpop":
                redis_client.client_kill_filter(_id=c["id"])
                killed.append(c["id"])
        return redis_client.llen(key(namespace, "done")) == jobs

    wait_until(blocked_killed_or_done, timeout_s=30, interval_s=0.05,
               message=f"the jobs did not all retry: {proc.read_log()[-3000:]}")
    assert killed
    done = sorted(t.decode() for t in redis_client.lrange(key(namespace, "done"), 0, -1))
    assert done == sorted(f"t{i}" for i in range(jobs))  # each once, on its retry
    stats = app.queue(hr.QUEUE).stats()
    assert stats.dead == 0
