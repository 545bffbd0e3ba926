"""Dead-letter retention: by age and by count per queue, trimmed oldest first in
bounded chunks by ``trim_dead.lua``; ``Queue.trim_dead`` and ``queue.atrim_dead``; a
running worker process applies it to the queues it serves."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import pytest
import redis
from apps.basic import build
from fixtures.basic import *  # noqa: F403
from fixtures.runs import Run
from helpers import CliProcess, wait_until

import batchq
from batchq.ops.queue import (
    DEFAULT_DEAD_MAX_AGE_S,
    DEFAULT_DEAD_MAX_COUNT,
    DeadRetention,
    atrim_dead,
)
from batchq.store import codec

pytestmark = pytest.mark.integration


def _bury(r: redis.Redis, q: batchq.Queue, n: int, died_ms: int, prefix: str) -> list[str]:
    """``n`` dead records dead-lettered at ``died_ms`` (+ i), as nack.lua writes them."""
    ids = [f"{prefix}{i:05d}" for i in range(n)]
    pipe = r.pipeline(transaction=False)
    for i, jid in enumerate(ids):
        pipe.hset(q.keys.dead_jobs, jid, codec.encode_dead_record(jid, "failed", b"x"))
        pipe.zadd(q.keys.dead, {jid: died_ms + i})
    pipe.execute()
    return ids


def _server_ms(r: redis.Redis) -> int:
    sec, usec = r.time()
    return int(sec) * 1000 + int(usec) // 1000


@pytest.fixture
def app(redis_url: str, namespace: str) -> batchq.App:
    return batchq.App(redis_url, namespace=namespace, dead_max_age_s=3600, dead_max_count=50)


def test_defaults_and_settings() -> None:
    a = batchq.App("redis://127.0.0.1:1/0")
    assert a.dead_retention == DeadRetention(DEFAULT_DEAD_MAX_AGE_S, DEFAULT_DEAD_MAX_COUNT)
    assert (DEFAULT_DEAD_MAX_AGE_S, DEFAULT_DEAD_MAX_COUNT) == (7 * 86400, 100_000)
    assert batchq.App("redis://127.0.0.1:1/0", dead_max_count=0).dead_retention.max_count == 0
    for bad in ({"dead_max_age_s": float("nan")}, {"dead_max_age_s": -1},
                {"dead_max_count": -1}, {"dead_max_count": 1.5}, {"dead_max_count": True}):
        with pytest.raises((TypeError, ValueError), match="dead_max"):
            batchq.App("redis://127.0.0.1:1/0", **bad)  # type: ignore[arg-type]


def test_env_sets_retention(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BATCHQ_DEAD_MAX_AGE_S", "60")
    monkeypatch.setenv("BATCHQ_DEAD_MAX_COUNT", "7")
    assert batchq.App("redis://127.0.0.1:1/0").dead_retention == DeadRetention(60, 7)
    monkeypatch.setenv("BATCHQ_DEAD_MAX_COUNT", "many")
    with pytest.raises(ValueError, match="BATCHQ_DEAD_MAX_COUNT"):
        batchq.App("redis://127.0.0.1:1/0")


def test_trim_by_age_then_by_count_oldest_first_in_chunks(app: batchq.App,
                                                          redis_client: redis.Redis) -> None:
    q = app.queue("mail")
    now = _server_ms(redis_client)
    old = _bury(redis_client, q, 30, now - 2 * 3600 * 1000, "old")  # past the age limit
    fresh = _bury(redis_client, q, 70, now - 1000, "new")
    assert q.stats().dead == 100

    # 7 per call, at most 2 calls: 14 of the 30 old ones
    assert q.trim_dead(chunk=7, max_chunks=2) == 14
    assert q.dead_ids()[:2] == old[14:16]

    # then the rest of the old ones, then the oldest fresh ones beyond 50
    assert q.trim_dead(chunk=7) == 16 + 20
    left = q.dead_ids()
    assert left == fresh[20:]
    assert redis_client.hlen(q.keys.dead_jobs) == 50
    assert q.trim_dead() == 0  # nothing beyond the retention any more


def test_zero_turns_a_limit_off_and_async_trim(app: batchq.App,
                                               redis_client: redis.Redis) -> None:
    q = app.queue("sms")
    now = _server_ms(redis_client)
    _bury(redis_client, q, 20, now - 10 * 86400 * 1000, "ancient")
    assert q.trim_dead(DeadRetention(max_age_s=0, max_count=0)) == 0
    assert q.trim_dead(DeadRetention(max_age_s=0, max_count=15)) == 5

    async def main() -> int:
        try:
            return await atrim_dead(app, "sms", chunk=4)
        finally:
            await app.aclose()

    assert asyncio.run(main()) == 15  # the app's own 1 hour removes the rest
    assert q.dead_ids() == [] and redis_client.exists(q.keys.dead_jobs) == 0


def test_trim_keeps_what_is_within_retention(app: batchq.App,
                                                         redis_client: redis.Redis) -> None:
    """A real dead letter (a job that failed for good) is kept when within retention."""
    q = app.queue("jobs")
    now = _server_ms(redis_client)
    _bury(redis_client, q, 3, now - 7200 * 1000, "gone")
    _bury(redis_client, q, 2, now, "kept")
    assert q.trim_dead() == 3
    assert q.dead_ids() == ["kept00000", "kept00001"]
    assert {j.reason for j in q.dead_jobs()} == {"failed"}


def test_a_running_worker_trims_its_queues_and_survives_one_that_fails(
        app: batchq.App, redis_client: redis.Redis, redis_url: str, log_path: Path,
        start_worker: Callable[..., CliProcess], runs: Callable[..., list[Run]]) -> None:
    """The worker applies its app's retention (here ``BATCHQ_DEAD_MAX_COUNT=5``) to every
    queue it serves; a queue whose trim fails (its dead set is not a sorted set) is
    logged and skipped, and the worker goes on serving both queues."""
    q = app.queue("keep")
    ids = _bury(redis_client, q, 12, _server_ms(redis_client) - 1000, "d")
    broken = app.keys("broken")
    redis_client.set(broken.dead, "not a sorted set")  # trim_dead.lua: WRONGTYPE
    w = start_worker(["broken", "keep"], env={"BATCHQ_DEAD_MAX_COUNT": "5"})

    wait_until(lambda: q.dead_ids() == ids[-5:], 10, message="the worker trims to 5")
    assert redis_client.hlen(q.keys.dead_jobs) == 5
    wait_until(lambda: "dead-letter retention of queue broken failed" in w.read_log(), 10,
               message="the failed trim is logged")
    producer = build(redis_url, app.namespace, str(log_path))
    try:
        producer.tasks["noop"].options(queue="broken").enqueue("b1")
        producer.tasks["noop"].options(queue="keep").enqueue("k1")
        wait_until(lambda: {r.token for r in runs("noop")} == {"b1", "k1"}, 10,
                   message="both queues still served")
    finally:
        producer.close()
    assert w.stop() == 0, w.read_log()
