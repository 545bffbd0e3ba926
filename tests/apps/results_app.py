"""A batchq app for the results / status / cancel tests (tests/results/test_results.py,
tests/results/test_cluster_results.py).

Handlers that record runs append ``<token> <pid>`` to ``$BATCHQ_TEST_LOG`` (O_APPEND),
outside the queue under test. ``build(url, namespace, log_path)`` makes the app in the
test process; the module-level ``app`` is built from the environment for ``python -m
batchq worker apps.results_app:app``.
"""

from __future__ import annotations

import asyncio
import gc
import os
import time
import weakref
from typing import Any

import batchq

QUEUE = "results"


def build(redis_url: str, namespace: str, log_path: str | None = None) -> batchq.App:
    app = batchq.App(redis_url, namespace=namespace, max_payload_bytes=64 * 1024)

    def record(token: Any) -> None:
        if not log_path:
            return
        fd = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, f"{token} {os.getpid()}\n".encode())
        finally:
            os.close(fd)

    @app.task(queue=QUEUE, result_ttl_s=60)
    async def square(x: int) -> dict[str, int]:
        return {"x": x, "square": x * x}

    @app.task(queue=QUEUE, result_ttl_s=60)
    def sync_square(x: int) -> list[int]:
        return [x, x * x]

    @app.task(queue=QUEUE, result_ttl_s=60, max_attempts=1)
    async def boom(message: str) -> None:
        raise RuntimeError(message)

    @app.task(queue=QUEUE, result_ttl_s=60, max_attempts=1)
    async def unencodable() -> Any:
        return object()

    @app.task(queue=QUEUE, result_ttl_s=60, max_attempts=1)
    async def huge() -> bytes:
        return b"x" * (128 * 1024)

    @app.task(queue=QUEUE, result_ttl_s=0.5)
    async def short_lived(x: int) -> int:
        return x

    @app.task(queue=QUEUE, result_ttl_s=60)
    async def nap(secs: float) -> float:
        await asyncio.sleep(secs)
        return secs

    @app.task(queue=QUEUE)
    async def plain(token: str) -> str:
        record(token)
        return token

    @app.task(queue=QUEUE, result_ttl_s=60)
    def slow_sync(secs: float) -> float:
        time.sleep(secs)
        return secs

    @app.task(queue=QUEUE, result_ttl_s=60)
    async def gc_state() -> dict[str, Any]:
        """The worker process's garbage collector as the handler sees it, and whether
        a cycle made now is still collected."""

        class Cycle:
            pass

        a, b = Cycle(), Cycle()
        a.other, b.other = b, a  # type: ignore[attr-defined]
        probe = weakref.ref(a)
        del a, b
        gc.collect(0)
        return {"threshold": list(gc.get_threshold()), "frozen": gc.get_freeze_count(),
                "enabled": gc.isenabled(), "cycle_freed": probe() is None}

    return app


app = build(os.environ.get("BATCHQ_REDIS_URL", "redis://127.0.0.1:6379/0"),
            os.environ.get("BATCHQ_TEST_NS", "batchq"), os.environ.get("BATCHQ_TEST_LOG"))
