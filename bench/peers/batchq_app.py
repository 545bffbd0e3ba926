"""batchq's app for ``bench peers``: the benchmark app (``bench.apps``) plus the job that
does I/O (``io``: one Redis round trip on the handler's own client, ``bench.peers.iojob``).

``python -m batchq worker bench.peers.batchq_app:app``; built from the same environment
as ``bench.apps`` (``BATCHQ_REDIS_URL``, ``BENCH_NAMESPACE``, ``BENCH_KEY``).
"""

from __future__ import annotations

import os
import time

import batchq
from bench import record
from bench.apps import NAMESPACE_ENV, QUEUE, make_app

from .iojob import around_trip


def add_io(app: batchq.App) -> batchq.App:
    """Register the ``io`` task on ``app`` (the harness's app and the workers' alike)."""
    rec = record.recorder()

    @app.task(queue=QUEUE)
    async def io() -> None:
        """One pipelined round trip to Redis on the handler's own ``redis.asyncio``
        client."""
        t0 = time.time()
        rec.ensure_task()
        await around_trip()
        rec.job(t0, time.time())

    return app


app = add_io(make_app(os.environ.get("BATCHQ_REDIS_URL"),
                      os.environ.get(NAMESPACE_ENV, "bench")))
