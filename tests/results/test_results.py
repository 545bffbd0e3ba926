"""Results, status and cancel end to end: real worker processes
(``batchq worker apps.results_app:app``), the real server, waiters in this process."""

from __future__ import annotations

import asyncio
import random
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from apps.results_app import QUEUE, build
from fixtures.basic import *  # noqa: F403
from helpers import drop_namespace, wait_until
from workers import WorkerProcs, worker_env

import batchq
from batchq.store import codec

pytestmark = pytest.mark.integration

APP_REF = "apps.results_app:app"


@pytest.fixture
def log_path(tmp_path: Path) -> Path:
    return tmp_path / "runs.log"


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


def ran(log_path: Path) -> list[str]:
    if not log_path.exists():
        return []
    return [line.split()[0] for line in log_path.read_text().splitlines()]


def test_job_ids_lead_to_their_queue(app: batchq.App):
    jid = app.tasks["square"].enqueue(3)
    assert codec.ref_of(jid) == codec.queue_ref(QUEUE)
    assert app.job_status(jid) == "ready"


def test_result_of_async_and_sync_handlers(app: batchq.App, workers: WorkerProcs):
    a = app.tasks["square"].enqueue(7)
    s = app.tasks["sync_square"].enqueue(5)
    workers.start("-q", QUEUE)
    assert app.result(a, timeout_s=20) == {"x": 7, "square": 49}
    assert app.result(s, timeout_s=20) == [5, 25]
    assert app.job_status(a) == "succeeded"
    # the result is kept for result_ttl_s (60 s here)
    k = app.keys(QUEUE)
    assert 0 < app.redis.pttl(k.result(a)) <= 60_000


def test_status_through_a_jobs_life(app: batchq.App, workers: WorkerProcs):
    nap = app.tasks["nap"]
    jid = nap.enqueue(1.5)
    later = nap.options(delay_s=3600).enqueue(0.0)
    assert app.job_status(jid) == "ready"
    assert app.job_status(later) == "delayed"
    assert app.job_status("0000" + "x" * 20) == "unknown"
    workers.start("-q", QUEUE)
    wait_until(lambda: app.job_status(jid) == "reserved", timeout_s=20)
    assert app.cancel(jid) is False  # running: cannot be cancelled
    assert app.result(jid, timeout_s=20) == 1.5
    assert app.job_status(jid) == "succeeded"
    assert app.cancel(later) is True
    assert app.job_status(later) == "cancelled"
    assert app.cancel(later) is False  # once
    assert app.redis.zcard(app.keys(QUEUE).delayed) == 0


def test_many_waiters_share_one_subscription(app: batchq.App, workers: WorkerProcs,
                                             redis_client: redis.Redis):
    jid = app.tasks["square"].enqueue(12)
    got: list[Any] = []
    errors: list[BaseException] = []

    def wait() -> None:
        try:
            got.append(app.result(jid, timeout_s=30))
        except BaseException as exc:
            errors.append(exc)

    async def await_many() -> list[Any]:
        return await asyncio.gather(*(app.aresult(jid, timeout_s=30) for _ in range(20)))

    threads = [threading.Thread(target=wait) for _ in range(20)]
    for t in threads:
        t.start()
    box: list[list[Any]] = []
    at = threading.Thread(target=lambda: box.append(asyncio.run(await_many())))
    at.start()
    channel = app.keys(QUEUE).done_channel(jid)
    # every waiter of this process is behind one subscription of the job's channel
    wait_until(lambda: redis_client.pubsub_numsub(channel)[0][1] >= 1, timeout_s=10)
    time.sleep(0.3)
    assert redis_client.pubsub_numsub(channel)[0][1] == 1
    assert app.job_status(jid) == "ready"  # nobody ran it yet: they block
    workers.start("-q", QUEUE)
    for t in threads:
        t.join(30)
    at.join(30)
    assert not errors, errors
    assert got == [{"x": 12, "square": 144}] * 20
    assert box == [[{"x": 12, "square": 144}] * 20]
    wait_until(lambda: redis_client.pubsub_numsub(channel)[0][1] == 0, timeout_s=10)


def test_dead_job_raises_job_dead_with_its_record(app: batchq.App, workers: WorkerProcs):
    jid = app.tasks["boom"].enqueue("no luck")
    workers.start("-q", QUEUE)
    with pytest.raises(batchq.JobDead) as info:
        app.result(jid, timeout_s=20)
    assert info.value.job_id == jid
    assert info.value.reason == "failed"
    assert info.value.error_type == "RuntimeError"
    assert info.value.error_message == "no luck"
    assert "RuntimeError" in info.value.record["traceback"]
    assert app.job_status(jid) == "dead"


def test_bad_results_fail_the_job(app: batchq.App, workers: WorkerProcs):
    odd = app.tasks["unencodable"].enqueue()
    big = app.tasks["huge"].enqueue()
    workers.start("-q", QUEUE)
    with pytest.raises(batchq.JobDead) as info:
        asyncio.run(app.aresult(odd, timeout_s=20))
    assert info.value.error_type == "TypeError"
    assert "cannot be encoded with msgpack" in info.value.error_message
    with pytest.raises(batchq.JobDead) as info:
        app.result(big, timeout_s=20)
    assert info.value.error_type == "ValueError"
    assert "above the limit of 65536" in info.value.error_message
    k = app.keys(QUEUE)
    assert not app.redis.exists(k.result(odd), k.result(big))


def test_expired_result_is_a_key_error(app: batchq.App, workers: WorkerProcs):
    jid = app.tasks["short_lived"].enqueue(4)
    workers.start("-q", QUEUE)
    assert app.result(jid, timeout_s=20) == 4
    wait_until(lambda: app.job_status(jid) == "unknown", timeout_s=5)
    with pytest.raises(KeyError):
        app.result(jid, timeout_s=1)


def test_waiting_times_out_and_bad_ids_are_refused(app: batchq.App):
    jid = app.tasks["square"].enqueue(1)
    t0 = time.monotonic()
    with pytest.raises(TimeoutError, match="still ready"):
        app.result(jid, timeout_s=0.3)
    assert time.monotonic() - t0 < 10
    with pytest.raises(TimeoutError):
        asyncio.run(app.aresult(jid, timeout_s=0.3))
    with pytest.raises(KeyError):
        app.result("zzzz" + "y" * 20, timeout_s=0.5)
    for bad in ("", "a:b", 12, None):
        with pytest.raises(ValueError, match="invalid job id"):
            app.job_status(bad)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="invalid job id"):
            app.cancel(bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="timeout_s"):
        app.result(jid, timeout_s=-1)


def test_result_ttl_is_checked():
    app = batchq.App("redis://127.0.0.1:1/0", namespace="n")
    with pytest.raises(ValueError, match="result_ttl_s"):
        app.task(result_ttl_s=0)(lambda: None)
    with pytest.raises(TypeError, match="result_ttl_s"):
        app.task(result_ttl_s="1h")(lambda: None)  # type: ignore[call-overload]
    with pytest.raises(ValueError, match="batch"):
        app.task(batch_size=10, result_ttl_s=5, name="b")(lambda jobs: None)  # type: ignore[call-overload]


def test_cancelled_jobs_never_run(app: batchq.App, workers: WorkerProcs, log_path: Path,
                                  redis_client: redis.Redis):
    plain = app.tasks["plain"]
    ids = plain.enqueue_many([(f"t{i}",) for i in range(200)])
    cancelled = {f"t{i}" for i in range(0, 200, 3)}
    for i in range(0, 200, 3):
        assert app.cancel(ids[i]) is True
        assert app.job_status(ids[i]) == "cancelled"
    # a cancelled job's waiter learns it at once
    with pytest.raises(batchq.JobCancelled):
        app.result(ids[0], timeout_s=5)
    workers.start("-q", QUEUE, "--burst", serving=0).wait(60)
    assert set(ran(log_path)) == {f"t{i}" for i in range(200)} - cancelled
    k = app.keys(QUEUE)
    assert int(redis_client.hget(k.stats, "cancelled") or 0) == len(cancelled)
    assert redis_client.hlen(k.cancel) == 0 and redis_client.hlen(k.pending) == 0


def test_cancel_races_a_fleet_popping(app: batchq.App, workers: WorkerProcs, log_path: Path):
    """Each job either ran or was cancelled (cancel returned True), never both, never
    neither: cancels race two worker processes popping the same jobs."""
    n = 3000
    ids = app.tasks["plain"].enqueue_many([(f"t{i}",) for i in range(n)])
    order = list(range(n))
    random.Random(7).shuffle(order)
    won: set[str] = set()
    # a tenth before any worker (all must win), the rest while two workers pop
    for i in order[: n // 10]:
        assert app.cancel(ids[i]) is True
        won.add(f"t{i}")
    workers.start("-q", QUEUE, "-c", "20", "--fetch-batch", "10", serving=0)
    workers.start("-q", QUEUE, "-c", "20", "--fetch-batch", "10", serving=0)
    wait_until(lambda: len(ran(log_path)) > 0, timeout_s=30)  # popping has begun
    for i in order[n // 10 :]:
        if app.cancel(ids[i]):
            won.add(f"t{i}")
    wait_until(lambda: app.queue(QUEUE).stats().ready == 0 and
               app.redis.hlen(app.keys(QUEUE).inflight) == 0, timeout_s=60)
    wait_until(lambda: len(ran(log_path)) >= n - len(won), timeout_s=30)
    runs = ran(log_path)
    assert len(runs) == len(set(runs)), "a job ran twice"
    assert set(runs).isdisjoint(won), "a cancelled job ran"
    assert set(runs) | won == {f"t{i}" for i in range(n)}, "a job neither ran nor was cancelled"
    assert len(won) < n, "no job ran"
    assert app.redis.hlen(app.keys(QUEUE).cancel) == 0  # every tombstone was used


def test_ready_jobs_of_every_enqueue_path_are_found_and_cancelled(app: batchq.App,
                                                                  redis_client: redis.Redis):
    # the ready-job bitmap (T:waiting*): enqueue, enqueue_many, aenqueue, aenqueue_many
    sq = app.tasks["square"]

    async def both() -> list[str]:
        return [await sq.aenqueue(1), *(await sq.aenqueue_many(range(300)))]

    ids = [sq.enqueue(1), *sq.enqueue_many(range(1500)), *asyncio.run(both())]
    assert all(codec.seq_of(j) is not None for j in ids)
    assert len({codec.seq_of(j) for j in ids}) == len(ids)
    k = app.keys(QUEUE)
    assert not redis_client.exists(k.pending)  # no per-job field for ready jobs
    picks = random.Random(7).sample(ids, 40)
    assert all(app.job_status(j) == "ready" for j in picks)
    assert all(app.cancel(j) for j in picks[:20])
    assert not any(app.cancel(j) for j in picks[:20])  # once only
    assert all(app.job_status(j) == "cancelled" for j in picks[:20])
    assert all(app.job_status(j) == "ready" for j in picks[20:])
    # a delayed job has no number: found through the pending hash
    later = sq.options(delay_s=60).enqueue(2)
    assert codec.seq_of(later) is None
    assert app.job_status(later) == "delayed"
    assert app.cancel(later) and app.job_status(later) == "cancelled"
