"""A batchq app for the security tests (ACL user, TLS, secrets).

Handlers record every run OUTSIDE Redis: one line ``<kind> <token> <pid>`` appended to
``$BATCHQ_TEST_LOG``. The module-level ``app`` is built from ``BATCHQ_TEST_NS``,
``BATCHQ_TEST_LOG`` and ``BATCHQ_REDIS_URL`` (if set) for ``python -m batchq worker
apps.sec_app:app``.
"""

from __future__ import annotations

import os
from typing import Any

import batchq


def build(redis_url: str | None, namespace: str, log_path: str | None = None) -> batchq.App:
    app = batchq.App(redis_url, namespace=namespace)

    def record(kind: str, token: Any) -> None:
        if not log_path:
            return
        fd = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, f"{kind} {token} {os.getpid()}\n".encode())
        finally:
            os.close(fd)

    @app.task
    async def rec(token: Any) -> None:
        record("rec", token)

    @app.task
    def sync_rec(token: Any) -> None:
        record("sync_rec", token)

    @app.task(batch_size=10)
    async def bulk(jobs: list[batchq.Job]) -> None:
        for j in jobs:
            record("bulk", j.args[0])

    @app.task(max_attempts=2, retry_backoff_s=0.01, retry_backoff_max_s=0.02)
    async def flaky(token: Any) -> None:
        record("flaky", token)
        raise ValueError(f"flaky {token}")

    return app


def runs(log_path: str, kind: str | None = None) -> list[str]:
    """Tokens of the recorded runs (optionally of one kind), in order."""
    try:
        with open(log_path) as f:
            lines = f.read().splitlines()
    except FileNotFoundError:
        return []
    return [line.split(" ")[1] for line in lines if kind is None or line.split(" ")[0] == kind]


app = (
    # no BATCHQ_REDIS_URL: the worker is given --redis-url
    build(os.environ.get("BATCHQ_REDIS_URL"), os.environ["BATCHQ_TEST_NS"],
          os.environ.get("BATCHQ_TEST_LOG"))
    if os.environ.get("BATCHQ_TEST_NS")
    else None
)
