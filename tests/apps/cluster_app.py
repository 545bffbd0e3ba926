"""A batchq app for the Redis Cluster tests.

Handlers record every run OUTSIDE Redis: one line appended to ``$BATCHQ_TEST_LOG``
(O_APPEND, shared by several processes)::

    <kind> <token> <pid> <unix time>

``build(url, namespace, log_path, flag_path)`` makes the app in-process; the module-level
``app`` is built from ``BATCHQ_REDIS_URL``, ``BATCHQ_TEST_NS``, ``BATCHQ_TEST_LOG`` and
``BATCHQ_TEST_FLAG`` for ``python -m batchq worker apps.cluster_app:app``.
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

import batchq


def build(redis_url: str, namespace: str, log_path: str | None = None,
          flag_path: str | None = None) -> batchq.App:
    app = batchq.App(redis_url, namespace=namespace)

    def record(kind: str, token: Any) -> None:
        if not log_path:
            return
        fd = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, f"{kind} {token} {os.getpid()} {time.time():.6f}\n".encode())
        finally:
            os.close(fd)

    @app.task
    async def rec(token: Any) -> None:
        record("rec", token)

    @app.task
    def sync_rec(token: Any) -> None:
        record("sync_rec", token)

    @app.task(max_attempts=3, retry_backoff_s=0.01, retry_backoff_max_s=0.05)
    async def flaky(token: Any) -> None:
        """Fails until the flag file exists."""
        if flag_path and os.path.exists(flag_path):
            record("fixed", token)
            return
        record("flaky", token)
        raise ValueError(f"flaky {token}")

    @app.task(max_attempts=20, retry_backoff_s=0.01, retry_backoff_max_s=0.05)
    async def slow(token: Any, secs: float) -> None:
        await asyncio.sleep(secs)
        record("slow", token)

    @app.task(max_attempts=1)
    async def limited(token: Any, hold_s: float) -> None:
        """Raises RateLimited(hold_s) on its first run (flow control), then records."""
        marker = f"{log_path}.{token}.limited"
        if hold_s and not os.path.exists(marker):
            open(marker, "w").close()
            record("limited", token)
            raise batchq.RateLimited(hold_s)
        record("rec", token)

    @app.task
    async def campaign_done(campaign_id: str, stats: dict[str, Any]) -> None:
        """A campaign's on_complete: records ``<id>:<total>:<succeeded>:<dead>:<cancelled>``."""
        record("campaign_done", ":".join(str(x) for x in (
            campaign_id, stats["total"], stats["succeeded"], stats["dead"],
            stats["cancelled"])))

    return app


app = (
    build(os.environ["BATCHQ_REDIS_URL"], os.environ["BATCHQ_TEST_NS"],
          os.environ.get("BATCHQ_TEST_LOG"), os.environ.get("BATCHQ_TEST_FLAG"))
    if os.environ.get("BATCHQ_TEST_NS") and os.environ.get("BATCHQ_REDIS_URL")
    else None
)
