"""A batchq app with one periodic task, for the scheduler takeover test
(``apps.periodic_app:app``).

Environment, read at import time: ``BATCHQ_REDIS_URL`` and ``PERIODIC_NS`` (the key
namespace; the module-level ``app`` is ``None`` without it).

``beat`` runs every second. It is a batch task with ``batch_size=1`` so that it sees its
``Job``, and records ``"<tick ms> <pid>"`` (the tick is the job's ``ready_ms``) in the
list ``<ns>:ticks``, outside the queue's keys.
"""

from __future__ import annotations

import os

import batchq


def ticks_key(namespace: str) -> str:
    return f"{namespace}:ticks"


def build(namespace: str, redis_url: str | None = None) -> batchq.App:
    """The app; the test builds its own copy (same periodic task: same leader lock)."""
    app = batchq.App(redis_url, namespace=namespace)
    key = ticks_key(namespace)

    @app.periodic(every_s=1, batch_size=1)
    async def beat(jobs: list[batchq.Job]) -> None:
        for job in jobs:
            await app.async_redis().rpush(key, f"{job.ready_ms} {os.getpid()}")

    return app


_ns = os.environ.get("PERIODIC_NS")
app = build(_ns) if _ns else None
