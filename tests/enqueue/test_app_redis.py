"""The options of a task on a real enqueue: queue, priority and attempts in the
entry, a delay on the server clock, the registry of queues."""

from __future__ import annotations

import pytest
import redis

from batchq import App
from batchq.store import codec

pytestmark = pytest.mark.integration


def test_options_take_effect_on_enqueue(redis_url, namespace):
    app = App(redis_url, namespace=namespace)
    r = redis.Redis.from_url(redis_url)
    try:
        @app.task(queue="main", priority=1, max_attempts=2)
        def work(x: int) -> int:
            return x

        jid = work.options(queue="other", priority=7).enqueue(5)
        (raw,) = r.lrange(app.keys("other").ready_for(7), 0, -1)
        job = codec.decode_entry(raw, "other")
        assert (job.id, job.task, job.args, job.priority, job.max_attempts) == (
            jid, "work", [5], 7, 2)

        def server_ms() -> int:
            sec, usec = r.time()
            return int(sec) * 1000 + int(usec) // 1000

        before = server_ms()
        work.options(delay_s=60).enqueue(6)
        after = server_ms()
        ((raw, due),) = r.zrange(app.keys("main").delayed, 0, -1, withscores=True)
        assert codec.decode_entry(raw, "main").args == [6]
        assert before + 60_000 <= due <= after + 60_000
        assert r.smembers(f"{namespace}:queues") == {b"main", b"other"}
    finally:
        r.close()
        app.close()
