"""A batchq app whose handler leaks, for the memory-cap tests (``apps.leak_app:app``).

Environment, read at import time: ``BATCHQ_REDIS_URL``, ``LEAK_NS`` (the namespace; the
module-level ``app`` is ``None`` without it) and ``LEAK_RUNS`` (a directory: every run is
recorded there in the delivery checker's format, ``runs-<pid>.log``, one ``os.write``
per line, outside Redis).
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

import batchq

LEAK_BYTES = 5 << 20
"""What each job keeps for ever: 5 MB, written (so resident), never freed."""

_kept: list[bytes] = []


def _write(directory: str, line: str) -> None:
    fd = os.open(os.path.join(directory, f"runs-{os.getpid()}.log"),
                 os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def build(redis_url: str | None, namespace: str, runs_dir: str | None = None) -> batchq.App:
    app = batchq.App(redis_url, namespace=namespace)

    @app.task(batch_size=1, max_attempts=3)
    async def leak(jobs: list[batchq.Job]) -> None:
        """args: (token, seconds)."""
        for job in jobs:
            token, secs = job.args
            t0 = time.time()
            pid = os.getpid()
            if runs_dir:
                _write(runs_dir, f"S {token} {job.id} {job.attempt} {pid} {t0:.6f}\n")
            _kept.append(b"x" * LEAK_BYTES)
            await asyncio.sleep(float(secs))
            if runs_dir:
                _write(runs_dir, f"E {token} {job.id} {job.attempt} {pid} {t0:.6f} "
                       f"{time.time():.6f}\n")

    return app


app: Any = (build(os.environ.get("BATCHQ_REDIS_URL"), os.environ["LEAK_NS"],
                  os.environ.get("LEAK_RUNS"))
            if os.environ.get("LEAK_NS") else None)
