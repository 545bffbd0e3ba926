"""Progress (``current_job().progress``) in real worker processes
(``apps.context_app:app``): seen by ``job_info`` while the job runs and after, coalesced
(writes counted on the server with ``INFO commandstats``, no MONITOR), the last value
written before the outcome, ``batchq job show``, and the delivery-receipt pattern."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from apps.context_app import PROGRESS_QUEUE, build
from apps.context_app import runs as read_runs
from fixtures.basic import *  # noqa: F403
from helpers import drop_namespace, run_cli, wait_until
from workers import WorkerProcs, worker_env

import batchq
from batchq.worker import exitcodes

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
def env(redis_url: str, namespace: str, log_path: Path) -> dict[str, str | None]:
    return worker_env({"BATCHQ_REDIS_URL": redis_url, "BATCHQ_TEST_NS": namespace,
                       "BATCHQ_TEST_LOG": str(log_path)})


@pytest.fixture
def workers(env: dict[str, str | None]) -> Iterator[WorkerProcs]:
    with WorkerProcs(APP_REF, env) as procs:
        yield procs


def _sets(r: redis.Redis) -> int:
    """SET commands the server has run so far (progress records are written with SET)."""
    stats = r.info("commandstats")
    return int(stats.get("cmdstat_set", {}).get("calls", 0))


def test_job_info_sees_progress_while_running_and_after(
        app: batchq.App, workers: WorkerProcs, redis_client: redis.Redis) -> None:
    gate = f"{app.namespace}:gate"
    jid = app.tasks["slow"].options(group="acme").enqueue(3, gate)
    assert app.job_info(jid).progress is None
    workers.start("-q", PROGRESS_QUEUE)
    for step in range(3):
        info = wait_until(lambda s=step: (i := app.job_info(jid)).message == f"step {s}"
                          and i, timeout_s=15, message=f"step {step} not seen")
        assert info.state == "reserved"
        assert info.progress == round(100 * step / 3)
        assert info.attempt == 1 and info.task == "slow" and info.queue == PROGRESS_QUEUE
        assert info.group == "acme"
        assert info.started_ms is not None and info.progress_at_ms is not None
        assert info.started_ms <= info.progress_at_ms
        assert info.finished_ms is None
        redis_client.rpush(gate, "go")
    info = wait_until(lambda: (i := app.job_info(jid)).state != "reserved" and i,
                      timeout_s=15)
    # the last value was written before the outcome: never a finished job without it
    assert info.message == "done"
    assert info.progress == 100
    assert info.finished_ms is not None and info.finished_ms >= info.started_ms
    # the state is job_status's, unchanged
    assert info.state == app.job_status(jid)
    assert asyncio.run(app.ajob_info(jid)) == info


def test_a_thousand_progress_calls_make_a_few_writes(
        app: batchq.App, workers: WorkerProcs, redis_client: redis.Redis) -> None:
    workers.start("-q", PROGRESS_QUEUE)
    # warm up: the worker's own start-up writes are over before counting
    warm = app.tasks["many"].enqueue(1)
    wait_until(lambda: app.job_info(warm).progress == 1, timeout_s=15)
    before = _sets(redis_client)
    sync_id = app.tasks["many"].enqueue(1000)
    async_id = app.tasks["amany"].enqueue(1000)
    wait_until(lambda: app.job_info(sync_id).progress == 1000
               and app.job_info(async_id).progress == 1000, timeout_s=30)
    writes = _sets(redis_client) - before
    # one write per job per 100 ms at most, plus the last one: 2,000 calls, a few writes
    assert 2 <= writes <= 12, writes
    info = app.job_info(sync_id)
    assert info.message == "item 1000 of 1000"


def test_job_show_cli(app: batchq.App, workers: WorkerProcs, env: dict[str, str | None],
                      redis_client: redis.Redis) -> None:
    gate = f"{app.namespace}:gate"
    jid = app.tasks["sync_slow"].enqueue(gate)
    workers.start("-q", PROGRESS_QUEUE)
    wait_until(lambda: app.job_info(jid).progress == 42, timeout_s=15)
    res = run_cli(["job", "show", APP_REF, jid, "--json"], env=env)
    assert res.returncode == 0, res.stderr
    got = json.loads(res.stdout)
    assert (got["id"], got["state"], got["progress"], got["message"]) == \
        (jid, "reserved", 42, "<b>half</b> way")
    assert got["attempt"] == 1 and got["task"] == "sync_slow"
    res = run_cli(["job", "show", APP_REF, jid], env=env)
    assert res.returncode == 0, res.stderr
    assert "progress" in res.stdout and "42" in res.stdout
    assert "<b>half</b> way" in res.stdout
    redis_client.rpush(gate, "go")
    # an id nothing is known of: exit 1; a malformed one: a usage error
    res = run_cli(["job", "show", APP_REF, "0000nothing0here00"], env=env)
    assert res.returncode == exitcodes.EXIT_ERROR and "unknown" in res.stdout
    res = run_cli(["job", "show", APP_REF, "a{b"], env=env)
    assert res.returncode == exitcodes.EXIT_USAGE
    assert "Traceback" not in res.stderr and len(res.stderr.strip().splitlines()) == 1


def test_delivery_receipts_by_job_info(app: batchq.App, workers: WorkerProcs,
                                       log_path: Path) -> None:
    """The pattern of docs/snippets/job-context.md: the handler stores the provider's
    message id as its progress message; a second process finds it by job id."""
    numbers = [f"+1555000{i:04d}" for i in range(20)]
    ids = app.tasks["send_sms"].enqueue_many([(n,) for n in numbers])
    workers.start("-q", PROGRESS_QUEUE, "--burst", serving=0)
    wait_until(lambda: len(read_runs(str(log_path), "sent")) >= len(numbers), timeout_s=30)
    sent = {r["id"]: r["provider_id"] for r in read_runs(str(log_path), "sent")}
    for jid in ids:
        info = wait_until(lambda j=jid: (i := app.job_info(j)).state != "reserved" and i,
                          timeout_s=15)
        assert info.message == sent[jid]
        assert info.progress == 100
        assert info.finished_ms is not None
