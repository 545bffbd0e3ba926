"""``batchq.current_job()`` in real worker processes (``apps.context_app:app``): the
context's fields in async, sync and batch handlers across a retry, a periodic job's
tick, two concurrent jobs each seeing their own, and the RuntimeError outside a job."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from apps.context_app import QUEUE, build
from apps.context_app import runs as read_runs
from fixtures.basic import *  # noqa: F403
from helpers import drop_namespace, wait_until
from workers import WorkerProcs, worker_env

import batchq

pytestmark = pytest.mark.integration

APP_REF = "apps.context_app:app"


@pytest.fixture
def app(redis_url: str, namespace: str, log_path: Path,
        redis_client: redis.Redis) -> Iterator[batchq.App]:
    a = build(redis_url, namespace, str(log_path))
    yield a
    a.close()
    drop_namespace(redis_client, namespace)


@pytest.fixture
def workers(redis_url: str, namespace: str, log_path: Path) -> Iterator[WorkerProcs]:
    env = worker_env({"BATCHQ_REDIS_URL": redis_url, "BATCHQ_TEST_NS": namespace,
                      "BATCHQ_TEST_LOG": str(log_path)})
    with WorkerProcs(APP_REF, env) as procs:
        yield procs


def _by_attempt(rows: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    return {r["attempt"]: r for r in rows}


def _check_run(row: dict[str, Any], jid: str, task: str, attempt: int) -> None:
    assert row["id"] == jid
    assert row["task"] == task
    assert row["queue"] == QUEUE
    assert row["attempt"] == attempt
    assert row["max_attempts"] == 3
    assert row["priority"] == 0
    assert row["enqueued_ms"] > 0
    assert row["ready_ms"] >= row["enqueued_ms"]
    # the lease is read from Redis (server time): it ends after the handler started
    assert row["lease_deadline_ms"] is not None
    assert row["lease_deadline_ms"] > row["started_ms"]


def test_fields_in_async_sync_and_batch_handlers_across_a_retry(
        app: batchq.App, workers: WorkerProcs, log_path: Path) -> None:
    with app.campaign("spring") as c:
        a = app.tasks["actx"].options(group="acme", key="k-1", campaign=c).enqueue("a")
    s = app.tasks["sctx"].options(priority=3).enqueue("s")
    b = [app.tasks["bctx"].enqueue(f"b{i}") for i in range(3)]
    workers.start("-q", QUEUE, "-c", "4")
    rows = wait_until(lambda: len(read_runs(str(log_path), "async")) >= 2
                      and len(read_runs(str(log_path), "sync")) >= 2
                      and len(read_runs(str(log_path), "batch")) >= 6
                      and read_runs(str(log_path)), timeout_s=30, message="runs")
    assert rows

    arun = _by_attempt(read_runs(str(log_path), "async"))
    assert set(arun) == {1, 2}
    for attempt, row in arun.items():
        _check_run(row, a, "actx", attempt)
        assert row["group"] == "acme"
        assert row["campaign"] == "spring"
        assert row["key"] == "k-1"
        assert row["same"] is True  # one context per job
    # the retry is a new run: a later start, the same enqueue time
    assert arun[2]["started_ms"] >= arun[1]["started_ms"]
    assert arun[2]["enqueued_ms"] == arun[1]["enqueued_ms"]

    srun = _by_attempt(read_runs(str(log_path), "sync"))
    assert set(srun) == {1, 2}
    for attempt, row in srun.items():
        _check_run({**row, "priority": 0}, s, "sctx", attempt)
        assert row["priority"] == 3
        assert (row["group"], row["campaign"], row["key"]) == (None, None, None)
        assert row["thread"] != "MainThread"  # run in the pool, context copied there

    brows = read_runs(str(log_path), "batch")
    for i, jid in enumerate(b):
        mine = _by_attempt([r for r in brows if r["token"] == f"b{i}"])
        assert set(mine) == {1, 2}
        for attempt, row in mine.items():
            _check_run(row, jid, "bctx", attempt)
    # a batch of several jobs: current_job() names the way (each job's own context)
    several = [r for r in brows if r["size"] > 1]
    for r in several:
        assert "job.context" in r["whole"]
    single = [r for r in brows if r["size"] == 1]
    for r in single:
        assert r["whole"] == "no error"


def test_sync_batch_handler_reads_each_jobs_context(
        app: batchq.App, workers: WorkerProcs, log_path: Path) -> None:
    ids = app.tasks["sbctx"].enqueue_many([(f"t{i}",) for i in range(5)])
    workers.start("-q", QUEUE, "--burst", serving=0)
    wait_until(lambda: len(read_runs(str(log_path), "sync_batch")) >= 5, timeout_s=30)
    rows = read_runs(str(log_path), "sync_batch")
    assert sorted(r["id"] for r in rows) == sorted(ids)
    assert {r["token"]: r["id"] for r in rows} == {f"t{i}": ids[i] for i in range(5)}


def test_periodic_job_ready_ms_is_its_tick(
        app: batchq.App, workers: WorkerProcs, log_path: Path) -> None:
    workers.start("-q", QUEUE)
    wait_until(lambda: read_runs(str(log_path), "tick"), timeout_s=30, message="no tick ran")
    row = read_runs(str(log_path), "tick")[0]
    assert row["task"] == "tick"
    assert row["ready_ms"] % 1000 == 0  # every_s=1: ticks fall on whole seconds
    assert row["ready_ms"] <= row["started_ms"]
    assert row["attempt"] == 1


def test_two_concurrent_jobs_see_their_own(
        app: batchq.App, workers: WorkerProcs, log_path: Path) -> None:
    ids = [app.tasks["overlap"].enqueue(f"o{i}", 0.3) for i in range(4)]
    workers.start("-q", QUEUE, "-c", "4")
    wait_until(lambda: len(read_runs(str(log_path), "overlap")) >= 4, timeout_s=30)
    rows = {r["token"]: r for r in read_runs(str(log_path), "overlap")}
    for i, jid in enumerate(ids):
        r = rows[f"o{i}"]
        assert r["before"] == r["after"] == r["child"] == jid


def test_outside_a_handler_is_a_clear_runtime_error(app: batchq.App) -> None:
    with pytest.raises(RuntimeError, match="outside a job"):
        batchq.current_job()
    job = batchq.Job("x" * 20, "t", [], {})
    with pytest.raises(RuntimeError, match="not running in this context"):
        job.context  # noqa: B018


def test_progress_after_the_job_ended_is_refused(
        app: batchq.App, workers: WorkerProcs, log_path: Path) -> None:
    app.tasks["late"].enqueue("l1")
    workers.start("-q", "progress")
    wait_until(lambda: read_runs(str(log_path), "late"), timeout_s=30)
    assert "has ended" in read_runs(str(log_path), "late")[0]["error"]
