"""A batchq app for the send-control tests: per-job timeouts and circuit breakers.

Handlers append a line to ``$BATCHQ_TEST_LOG`` (``apps.basic``'s format). The provider
behind breaker ``prov`` fails while the Redis key ``<ns>:down`` exists, so a test turns
it off and on from outside the workers.
``build(url, namespace, log_path)`` makes the app in-process; the module-level ``app``
is built from the environment for ``python -m batchq worker apps.sendctl_app:app``.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

import batchq
from apps.basic import _recorder


class ProviderDown(ConnectionError):
    pass


def build(redis_url: str, namespace: str, log_path: str | None = None) -> batchq.App:
    app = batchq.App(redis_url, namespace=namespace)
    record = _recorder(log_path)
    down = f"{namespace}:down"
    app.breaker("prov", failures=5, within_s=30, open_s=1.5, half_open_jobs=2,
                exceptions=(ProviderDown,))

    async def provider(kind: str, token: Any) -> None:
        async with app.breaker("prov"):
            if await app.async_redis().exists(down):
                record(kind + "_fail", token)
                raise ProviderDown(f"provider down ({token})")
        record(kind, token)

    @app.task(queue="sc", timeout_s=10, max_attempts=1)
    async def nap(token: Any, secs: float) -> None:
        await asyncio.sleep(secs)
        record("nap", token)

    @app.task(queue="sc", timeout_s=10, max_attempts=1)
    def sync_nap(token: Any, secs: float) -> None:
        import time
        time.sleep(secs)
        record("sync_nap", token)

    @app.task(queue="sc", max_attempts=1)
    async def call(token: Any) -> None:
        """Behind the breaker, not bound to it: a failure fails the job."""
        await provider("call", token)

    @app.task(queue="sc", breaker="prov", max_attempts=1)
    async def bound(token: Any) -> None:
        await provider("bound", token)

    @app.task(queue="sc", max_attempts=1)
    async def backup(token: Any) -> None:
        record("backup", token)

    @app.task(queue="sc", breaker="prov", fallback=backup, max_attempts=1)
    async def routed(token: Any) -> None:
        await provider("routed", token)

    return app


app = build(os.environ.get("BATCHQ_REDIS_URL", "redis://127.0.0.1:6379/0"),
            os.environ.get("BATCHQ_TEST_NS", "batchq"), os.environ.get("BATCHQ_TEST_LOG"))
