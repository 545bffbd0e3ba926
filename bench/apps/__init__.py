"""The batchq app the benchmarks run: ``python -m batchq worker bench.apps:app``.

Every task records its handler's entry and exit time (``bench.record``) and nothing
else; the timing costs a lock and a few comparisons per job. The module-level ``app``
is built from the environment the harness gives the worker fleet:
``BATCHQ_REDIS_URL``, ``BENCH_NAMESPACE``, ``BENCH_KEY`` (where timings go).
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

import batchq
from bench import record

QUEUE = "bench"
BATCH_SIZE = 100
NAMESPACE_ENV = "BENCH_NAMESPACE"


def make_app(redis_url: str | None = None, namespace: str = "bench") -> batchq.App:
    """The benchmark app (the same tasks in the harness and in the workers)."""
    app = batchq.App(redis_url, namespace=namespace)
    rec = record.recorder()

    @app.task(queue=QUEUE)
    async def noop(*args: Any) -> None:
        """A no-op job; its arguments (a payload in some runs) are ignored."""
        t0 = time.time()
        rec.ensure_task()
        rec.job(t0, time.time())

    @app.task(queue=QUEUE, result_ttl_s=3600)
    async def noop_result(*args: Any) -> Any:
        """``noop`` whose return value (its first argument, or None) is kept an hour
        (bench/tools/results_figures.py)."""
        t0 = time.time()
        rec.ensure_task()
        rec.job(t0, time.time())
        return args[0] if args else None

    @app.task(queue=QUEUE, batch_size=BATCH_SIZE)
    async def batch_noop(jobs: list[batchq.Job]) -> dict[str, str]:
        """A batch handler that does nothing with up to 100 jobs (none fail)."""
        t0 = time.time()
        rec.ensure_task()
        rec.job(t0, time.time(), len(jobs))
        return {}

    @app.task(queue=QUEUE)
    async def io_wait(seconds: float) -> None:
        """An I/O-bound job (the ``iocurve`` scenario): awaits ``seconds``, standing in
        for an HTTP call to a provider; entry and exit are recorded as for ``noop``."""
        t0 = time.time()
        rec.ensure_task()
        await asyncio.sleep(seconds)
        rec.job(t0, time.time())

    @app.task(queue=QUEUE)
    async def lat(intended: float, sent: float) -> None:
        """A latency probe: ``intended`` / ``sent`` are the open-loop send times."""
        t0 = time.time()
        rec.ensure_task()
        rec.sample(intended, sent, t0, time.time())

    @app.task(queue=QUEUE)
    def campaign_mark(campaign_id: str, stats: dict[str, Any]) -> None:
        """A campaign's on_complete (the ``campaign`` scenario): notes when it started."""
        app.redis.hset(f"{app.namespace}:campaign-latency", campaign_id, repr(time.time()))

    return app


app = make_app(os.environ.get("BATCHQ_REDIS_URL"), os.environ.get(NAMESPACE_ENV, "bench"))
