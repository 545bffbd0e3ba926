"""A batchq app for the supervisor end-to-end tests (``apps.sup_app:app``).

Environment, read at import time:

* ``BATCHQ_REDIS_URL`` — the app's Redis (``--redis-url`` overrides it in the CLI);
* ``SUP_NS`` — the key namespace (the module-level ``app`` is ``None`` without it);
* ``SUP_VERSION_FILE`` — its content, stripped, becomes ``VERSION``. Because it is read
  when the module is imported, a SIGHUP (which re-imports the app in the new children)
  is observable: jobs run after the restart record the new content. The content
  ``RAISE`` makes the import fail (an app that cannot be imported).

Every handler records what it did OUTSIDE the queue under test, in two Redis lists of
the namespace that are not queue keys (so they survive whatever happens to the queue)::

    <ns>:starts   "<job id> <attempt> <pid> <VERSION>"  when a handler begins
    <ns>:runs     the same line                          when it finished

Every task is a batch task with ``batch_size=1``, so the handler sees its ``Job`` (id and
attempt) while still running one job per call.
"""

from __future__ import annotations

import asyncio
import os
import pathlib
import time

import batchq

_version_file = os.environ.get("SUP_VERSION_FILE")
VERSION = pathlib.Path(_version_file).read_text().strip() if _version_file else "none"
if VERSION == "RAISE":
    raise RuntimeError("sup_app refuses to import: the version file says RAISE")


def starts_key(namespace: str) -> str:
    return f"{namespace}:starts"


def runs_key(namespace: str) -> str:
    return f"{namespace}:runs"


def build(namespace: str, redis_url: str | None = None) -> batchq.App:
    """The app; tests build their own copy (same task names and options) to enqueue."""
    app = batchq.App(redis_url, namespace=namespace)
    starts, runs = starts_key(namespace), runs_key(namespace)

    async def record(key: str, job: batchq.Job) -> None:
        line = f"{job.id} {job.attempt} {os.getpid()} {VERSION}"
        await app.async_redis().rpush(key, line)

    @app.task(batch_size=1, max_attempts=5)
    async def quick(jobs: list[batchq.Job]) -> None:
        for job in jobs:
            await record(starts, job)
            await record(runs, job)

    @app.task(batch_size=1, max_attempts=5)
    async def slow(jobs: list[batchq.Job]) -> None:
        """args: (seconds,) — sleeps without blocking the loop."""
        for job in jobs:
            await record(starts, job)
            await asyncio.sleep(float(job.args[0]))
            await record(runs, job)

    @app.task(batch_size=1, max_attempts=3)
    async def hog(jobs: list[batchq.Job]) -> None:
        """args: (seconds, block_attempts) — on attempts up to ``block_attempts`` it
        blocks the event loop with ``time.sleep`` inside ``async def``."""
        for job in jobs:
            secs, block_attempts = job.args
            await record(starts, job)
            if job.attempt <= block_attempts:
                time.sleep(float(secs))  # deliberately blocks the event loop
            await record(runs, job)

    @app.task(batch_size=1, max_attempts=5)
    async def which_version(jobs: list[batchq.Job]) -> None:
        """Its behaviour depends on the code loaded: it records ``VERSION``."""
        for job in jobs:
            await record(starts, job)
            await record(runs, job)

    return app


app = build(os.environ["SUP_NS"]) if os.environ.get("SUP_NS") else None
