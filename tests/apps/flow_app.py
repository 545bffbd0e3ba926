"""A batchq app for the flow-control tests (groups, limits, quotas, RateLimited).

Every handler appends ``<kind> <token> <group> <pid> <attempt> <start> <end>`` to the file
named by ``$BATCHQ_TEST_LOG`` (O_APPEND: several worker processes share it), with the
handler's own clock, so a test can count starts per second and jobs running at once.
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

import batchq


def _record(log_path: str | None, kind: str, job: batchq.Job, start: float,
            end: float) -> None:
    if not log_path:
        return
    group = job.id.split("~", 1)[1].removesuffix("_m") if "~" in job.id else "-"
    line = (f"{kind} {job.args[0]} {group} {os.getpid()} {job.attempt} {start:.6f} "
            f"{end:.6f}\n")
    fd = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def build(redis_url: str, namespace: str, log_path: str | None = None) -> batchq.App:
    app = batchq.App(redis_url, namespace=namespace)

    @app.task(batch_size=1, max_attempts=3)
    async def work(jobs: list[batchq.Job]) -> None:
        """Sleeps ``args[1]`` seconds (default 0)."""
        for job in jobs:
            t0 = time.time()
            secs = job.args[1] if len(job.args) > 1 else 0
            if secs:
                await asyncio.sleep(secs)
            _record(log_path, "work", job, t0, time.time())

    @app.task(batch_size=1, max_attempts=1, max_hold_s=86400)  # tests hold for an hour
    async def throttled(jobs: list[batchq.Job]) -> None:
        """Raises RateLimited(args[1]) on the first run of a token listed in args[2]."""
        for job in jobs:
            t0 = time.time()
            token, hold_s, limited = job.args[0], job.args[1], job.args[2]
            marker = f"{log_path}.{token}.limited"
            if limited and not os.path.exists(marker):
                open(marker, "w").close()
                _record(log_path, "limited", job, t0, time.time())
                raise batchq.RateLimited(hold_s)
            _record(log_path, "work", job, t0, time.time())

    @app.task(batch_size=1, max_attempts=1)
    async def hostile_limit(jobs: list[batchq.Job]) -> None:
        """The first run raises a RateLimited whose retry_after_s was set to nan."""
        for job in jobs:
            t0 = time.time()
            marker = f"{log_path}.{job.args[0]}.limited"
            if not os.path.exists(marker):
                open(marker, "w").close()
                exc = batchq.RateLimited(0.1)
                exc.retry_after_s = float("nan")
                _record(log_path, "limited", job, t0, time.time())
                raise exc
            _record(log_path, "work", job, t0, time.time())

    return app


app: Any = (
    build(os.environ["BATCHQ_REDIS_URL"], os.environ["BATCHQ_TEST_NS"],
          os.environ.get("BATCHQ_TEST_LOG"))
    if os.environ.get("BATCHQ_TEST_NS") and os.environ.get("BATCHQ_REDIS_URL")
    else None
)
