"""A batchq app for integration tests.

Every handler records what it did OUTSIDE the queue under test: one line appended to
the file named by ``$BATCHQ_TEST_LOG`` (O_APPEND, so several worker processes can share
it)::

    <kind> <token> <pid> <attempt or -> <unix time> <thread name>

``build(url, namespace, log_path)`` makes a fresh app (used in-process by the tests);
the module-level ``app`` is built from the environment for ``python -m batchq worker
apps.basic:app`` (``BATCHQ_REDIS_URL``, ``BATCHQ_TEST_NS``, ``BATCHQ_TEST_LOG``).
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from typing import Any

import batchq


def _recorder(log_path: str | None) -> Any:
    def record(kind: str, token: Any, attempt: Any = "-") -> None:
        if not log_path:
            return
        line = (f"{kind} {token} {os.getpid()} {attempt} {time.time():.6f} "
                f"{threading.current_thread().name}\n")
        fd = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line.encode())
        finally:
            os.close(fd)

    return record


def build(redis_url: str, namespace: str, log_path: str | None = None) -> batchq.App:
    app = batchq.App(redis_url, namespace=namespace)
    record = _recorder(log_path)

    @app.task
    async def noop(token: Any) -> None:
        record("noop", token)

    @app.task
    async def quiet(token: Any) -> None:
        """A no-op that records nothing: a drain of these outpaces the server."""

    @app.task
    def sync_noop(token: Any) -> None:
        record("sync_noop", token)

    @app.task(max_attempts=5)
    async def nap(token: Any, secs: float) -> None:
        record("start", token)
        await asyncio.sleep(secs)
        record("end", token)

    @app.task(batch_size=1, max_attempts=5)
    async def nap_job(jobs: list[batchq.Job]) -> None:
        """Like nap, but sees its Job: records the job id and the attempt."""
        for job in jobs:
            record("start", job.id, job.attempt)
            await asyncio.sleep(job.args[0])
            record("end", job.id, job.attempt)

    @app.task(max_attempts=3, retry_backoff_s=0.01, retry_backoff_max_s=0.05)
    async def failing(token: Any) -> None:
        record("failing", token)
        raise ValueError(f"boom {token}")  # THE-RAISE-LINE

    @app.task(max_attempts=3, retry_backoff_s=0.01, retry_backoff_max_s=0.05)
    async def failing_slow(token: Any, secs: float) -> None:
        """Fails after ``secs`` (the retry is written after the worker's next pop)."""
        record("failing_slow", token)
        await asyncio.sleep(secs)
        raise ValueError(f"slow boom {token}")

    @app.task(timeout_s=0.2, max_attempts=1)
    async def slow_async(token: Any, secs: float) -> None:
        record("start", token)
        await asyncio.sleep(secs)
        record("end", token)

    @app.task(timeout_s=0.2, max_attempts=1)
    def slow_sync(token: Any, secs: float) -> None:
        record("start", token)
        time.sleep(secs)
        record("end", token)

    @app.task(batch_size=50, max_attempts=2, retry_backoff_s=0.01, retry_backoff_max_s=0.05)
    async def bulk(jobs: list[batchq.Job]) -> dict[str, Exception]:
        """Fails (returns an error for) every job whose token is a multiple of 10."""
        record("batch", len(jobs))
        failures: dict[str, Exception] = {}
        for job in jobs:
            if not isinstance(job, batchq.Job):
                raise TypeError(f"batch handler got {type(job).__name__}")
            token = job.args[0]
            record("bulk", token, job.attempt)
            if token % 10 == 0:
                failures[job.id] = Exception("x")
        return failures

    @app.task(batch_size=10)
    async def nap_batch(jobs: list[batchq.Job]) -> None:
        """A slow batch handler: records the batch size, then sleeps ``args[1]``."""
        record("nap_batch", len(jobs))
        await asyncio.sleep(jobs[0].args[1])

    @app.task(max_attempts=2)
    def poison(token: Any) -> None:
        record("poison", token)
        os.kill(os.getpid(), signal.SIGKILL)

    @app.task(max_attempts=10)
    async def sturdy(token: Any) -> None:
        record("sturdy", token)

    return app


app = (
    build(os.environ["BATCHQ_REDIS_URL"], os.environ["BATCHQ_TEST_NS"],
          os.environ.get("BATCHQ_TEST_LOG"))
    if os.environ.get("BATCHQ_TEST_NS") and os.environ.get("BATCHQ_REDIS_URL")
    else None
)
