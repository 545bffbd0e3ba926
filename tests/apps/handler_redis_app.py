"""A batchq app whose handlers touch Redis through ``batchq.BatchingRedis``
(tests/handlers/test_batching_redis_worker.py).

One handle per module, made at import (before the supervisor forks), on the URL of
``$BATCHQ_TEST_HANDLER_URL`` (the session's Redis in the tests). Each handler writes
what it saw to keys ``<namespace>:h:*`` on that URL, through the handle:

* ``visit(n)``: ``INCR`` the visit counter and ``RPUSH`` ``pid:client id`` (the
  connection the command came on), then records the handle's round trips so far;
* ``bump(key)``: ``INCR key`` (a key holding text fails the job with ``WRONGTYPE``);
* ``hold(token)``: on its first attempt a ``BLPOP`` that the test cuts by killing the
  connection; on a retry, ``RPUSH`` of the token to the done list.
"""

from __future__ import annotations

import asyncio
import os

import batchq

QUEUE = "hr"

r = batchq.BatchingRedis(os.environ.get("BATCHQ_TEST_HANDLER_URL"),
                         client_name="batchq-test-handler")


def build(redis_url: str | None, namespace: str) -> batchq.App:
    app = batchq.App(redis_url, namespace=namespace)

    def key(name: str) -> str:
        return f"{namespace}:h:{name}"

    @app.task(queue=QUEUE)
    async def visit(n: int) -> None:
        pid = os.getpid()
        _, client_id = await r.execute_many(("INCR", key("visits")), ("CLIENT", "ID"))
        await asyncio.sleep(0.005)  # long enough for both children to take jobs
        await r.execute("RPUSH", key("conns"), f"{pid}:{client_id}")
        await r.execute("HSET", key("trips"), str(pid), str(r.round_trips))

    @app.task(queue=QUEUE, max_attempts=1)
    async def bump(name: str) -> None:
        await r.execute("INCR", key(name))

    @app.task(queue=QUEUE, max_attempts=3, retry_backoff_s=0.05, retry_backoff_max_s=0.05)
    async def hold(token: str) -> None:
        if batchq.current_job().attempt == 1:
            await r.execute("BLPOP", key("never"), 30)
            return
        await r.execute("RPUSH", key("done"), token)

    return app


app = build(os.environ.get("BATCHQ_REDIS_URL"), os.environ.get("BATCHQ_TEST_NS", "hr"))
