"""A batchq app for the job-context and progress tests (tests/integration/
test_job_context.py, test_progress.py, tests/web/test_job_progress.py).

Every handler that looks at its context appends one JSON line to ``$BATCHQ_TEST_LOG``
(O_APPEND, outside Redis): ``{"kind", "token", <the context's fields>}``. The
module-level ``app`` is built from the environment (``BATCHQ_REDIS_URL``,
``BATCHQ_TEST_NS``, ``BATCHQ_TEST_LOG``) for ``python -m batchq worker
apps.context_app:app``.
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
from typing import Any

import batchq

QUEUE = "ctx"
PROGRESS_QUEUE = "progress"
FIELDS = ("id", "task", "queue", "attempt", "max_attempts", "group", "campaign", "key",
          "priority", "enqueued_ms", "ready_ms", "lease_deadline_ms", "started_ms")


def fields(ctx: batchq.JobContext) -> dict[str, Any]:
    return {name: getattr(ctx, name) for name in FIELDS}


def build(redis_url: str | None, namespace: str, log_path: str | None) -> batchq.App:
    app = batchq.App(redis_url, namespace=namespace)

    def note(kind: str, token: Any, **extra: Any) -> None:
        if not log_path:
            return
        line = json.dumps({"kind": kind, "token": token, "pid": os.getpid(), **extra})
        fd = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, (line + "\n").encode())
        finally:
            os.close(fd)

    # --- the context in each kind of handler, across a retry ----------------------------

    @app.task(queue=QUEUE, max_attempts=3, retry_backoff_s=0.05, retry_backoff_max_s=0.05)
    async def actx(token: str) -> None:
        ctx = batchq.current_job()
        note("async", token, **fields(ctx), same=batchq.current_job() is ctx)
        if ctx.attempt == 1:
            raise RuntimeError("first attempt fails")

    @app.task(queue=QUEUE, max_attempts=3, retry_backoff_s=0.05, retry_backoff_max_s=0.05)
    def sctx(token: str) -> None:
        ctx = batchq.current_job()
        note("sync", token, **fields(ctx), thread=threading.current_thread().name)
        if ctx.attempt == 1:
            raise RuntimeError("first attempt fails")

    @app.task(queue=QUEUE, batch_size=10, max_attempts=3, retry_backoff_s=0.05,
              retry_backoff_max_s=0.05)
    async def bctx(jobs: list[batchq.Job]) -> dict[str, str]:
        try:
            batchq.current_job()
            whole = "no error"
        except RuntimeError as exc:
            whole = str(exc)
        failed = {}
        for job in jobs:
            ctx = job.context
            note("batch", job.args[0], **fields(ctx), size=len(jobs), whole=whole)
            if ctx.attempt == 1:
                failed[job.id] = "first attempt fails"
        return failed

    @app.task(queue=QUEUE, batch_size=10, max_attempts=1)
    def sbctx(jobs: list[batchq.Job]) -> None:
        for job in jobs:
            note("sync_batch", job.args[0], **fields(job.context), size=len(jobs))

    @app.task(queue=QUEUE, max_attempts=1)
    async def overlap(token: str, sleep_s: float) -> None:
        """Two of these run at once: each must keep seeing its own job, also in a task it
        starts and across awaits."""
        before = batchq.current_job().id

        async def child() -> str:
            await asyncio.sleep(sleep_s / 2)
            return batchq.current_job().id

        kid = asyncio.create_task(child())
        await asyncio.sleep(sleep_s)
        note("overlap", token, before=before, after=batchq.current_job().id,
             child=await kid)

    @app.periodic(every_s=1, queue=QUEUE, max_attempts=1)
    async def tick() -> None:
        ctx = batchq.current_job()
        note("tick", ctx.id, **fields(ctx))

    # --- progress ----------------------------------------------------------------------

    @app.task(queue=PROGRESS_QUEUE, max_attempts=1)
    def many(n: int) -> None:
        ctx = batchq.current_job()
        for i in range(n):
            ctx.progress(i + 1, f"item {i + 1} of {n}")

    @app.task(queue=PROGRESS_QUEUE, max_attempts=1)
    async def amany(n: int) -> None:
        for i in range(n):
            batchq.current_job().progress(i + 1)
            if i % 100 == 0:
                await asyncio.sleep(0)

    @app.task(queue=PROGRESS_QUEUE, max_attempts=1)
    async def slow(steps: int, gate_key: str) -> None:
        """Reports step i, then waits until the test pushes to ``gate_key``."""
        r = app.async_redis()
        for i in range(steps):
            batchq.current_job().progress(round(100 * i / steps), f"step {i}")
            await r.blpop([gate_key], timeout=30)
        batchq.current_job().progress(100, "done")

    @app.task(queue=PROGRESS_QUEUE, max_attempts=1)
    def sync_slow(gate_key: str) -> None:
        batchq.current_job().progress(42, "<b>half</b> way")
        app.redis.blpop([gate_key], timeout=30)

    @app.task(queue=PROGRESS_QUEUE, max_attempts=1)
    async def send_sms(to: str) -> None:
        """The delivery-receipt pattern: the provider's message id as the progress
        message (here a made-up one)."""
        provider_id = f"SM{abs(hash(to)) % 10**8:08d}"
        note("sent", to, provider_id=provider_id, id=batchq.current_job().id)
        batchq.current_job().progress(100, message=provider_id)

    @app.task(queue=PROGRESS_QUEUE, max_attempts=1)
    async def late(token: str) -> None:
        ctx = batchq.current_job()
        loop = asyncio.get_running_loop()
        loop.call_later(0.2, lambda: _try_late(ctx, note, token))

    return app


def _try_late(ctx: batchq.JobContext, note: Any, token: str) -> None:
    try:
        ctx.progress(1)
        note("late", token, error=None)
    except RuntimeError as exc:
        note("late", token, error=str(exc))


def runs(log_path: str, kind: str | None = None) -> list[dict[str, Any]]:
    if not os.path.exists(log_path):
        return []
    with open(log_path) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return [r for r in rows if kind is None or r["kind"] == kind]


_ns = os.environ.get("BATCHQ_TEST_NS")
app = build(os.environ.get("BATCHQ_REDIS_URL"), _ns, os.environ.get("BATCHQ_TEST_LOG")) \
    if _ns else None

__all__ = ["app", "build", "runs"]
