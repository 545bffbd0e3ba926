"""A batchq app for the job-events tests (tests/observe/test_events.py,
tests/observe/test_cluster_events.py, tests/web/test_events_page.py).

Every task runs on queue ``ev`` (``EV_QUEUE``). Handlers that the tests must see ran
append one JSON line to ``$BATCHQ_TEST_LOG`` (O_APPEND, outside Redis). The module-level
``app`` is built from the environment (``BATCHQ_REDIS_URL``, ``BATCHQ_TEST_NS``,
``BATCHQ_TEST_LOG``) for ``python -m batchq worker apps.events_app:app``.
"""

from __future__ import annotations

import asyncio
import json
import os
from typing import Any

import batchq

EV_QUEUE = "ev"


def build(redis_url: str | None, namespace: str, log_path: str | None) -> batchq.App:
    app = batchq.App(redis_url, namespace=namespace)

    def note(kind: str, **fields: Any) -> None:
        if not log_path:
            return
        line = json.dumps({"kind": kind, "pid": os.getpid(), **fields})
        fd = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, (line + "\n").encode())
        finally:
            os.close(fd)

    @app.task(queue=EV_QUEUE)
    async def ok(token: Any) -> None:
        """Succeeds."""

    @app.task(queue=EV_QUEUE, max_attempts=3, retry_backoff_s=0.01, retry_backoff_max_s=0.01)
    async def flaky(token: Any) -> None:
        """Fails its first attempt, then succeeds."""
        if batchq.current_job().attempt == 1:
            raise ValueError(f"flaky {token}")

    @app.task(queue=EV_QUEUE, max_attempts=2, retry_backoff_s=0.01, retry_backoff_max_s=0.01)
    async def doomed(token: Any) -> None:
        """Always fails: retried once, then dead."""
        raise RuntimeError(f"doomed {token}")

    @app.task(queue=EV_QUEUE, max_attempts=5)
    async def limited(token: Any) -> None:
        """The provider says "too many" on the first run: the queue is held briefly."""
        if batchq.current_job().attempt == 1 and not os.path.exists(f"{log_path}.{token}"):
            open(f"{log_path}.{token}", "w").close()
            raise batchq.RateLimited(0.2)

    @app.task(queue=EV_QUEUE, max_attempts=20)
    async def nap(token: Any, secs: float) -> None:
        """Sleeps: a worker can be killed while it runs."""
        await asyncio.sleep(secs)

    @app.task(queue=EV_QUEUE, max_attempts=1)
    async def send_sms(to: str) -> None:
        """The delivery-receipt pattern: the provider's message id (made up here) as the
        job's progress message."""
        provider_id = f"SM{abs(hash(to)) % 10**8:08d}"
        note("sent", to=to, provider_id=provider_id, id=batchq.current_job().id)
        batchq.current_job().progress(100, message=provider_id)

    return app


_ns = os.environ.get("BATCHQ_TEST_NS")
app = build(os.environ.get("BATCHQ_REDIS_URL"), _ns, os.environ.get("BATCHQ_TEST_LOG")) \
    if _ns else None

__all__ = ["EV_QUEUE", "app", "build"]
