"""A batchq app for the live Prometheus test (``tests.apps.metrics_app:app``).

Every outcome the dashboard and the alerts look at, on queue ``default``:

* ``ok`` succeeds;
* ``fail`` always raises: 2 attempts (failed + retried, then failed + dead ``failed``);
* ``sleepy`` outlives its 0.1 s timeout once (failed + dead ``timeout``);
* ``later`` succeeds; the test enqueues it with a delay;
* ``new_year`` is a periodic task (once a year: never due while the test runs) whose
  next run the metrics export;
* ``hog`` blocks its worker's event loop for ``HOG_BLOCK_S`` on its first attempt, longer
  than the worker's ``--lease-s 2``: the lease expires and another process takes the job
  again (a redelivery), and the first result arrives for an expired lease (a stale ack).
  Each attempt is first recorded (its number) in the list ``hog_key(namespace)``, outside
  the queue, so the test knows when the process is blocked;
* ``limited`` (queue ``flow``) is for flow control: the test gives that queue limits and
  holds a limited group that has a job, so the flow-control panels and alerts have data.

``python -m batchq worker tests.apps.metrics_app:app`` builds ``app`` from
``$BATCHQ_REDIS_URL`` and ``$METRICS_APP_NS`` (``None`` without the namespace); tests
build their own copy with ``build(url, namespace)`` to enqueue.
"""

from __future__ import annotations

import asyncio
import os
import time

import batchq

QUEUE = "default"
FLOW_QUEUE = "flow"
HOG_BLOCK_S = 4.0


def hog_key(namespace: str) -> str:
    return f"{namespace}:hog-attempts"


def build(redis_url: str | None, namespace: str) -> batchq.App:
    app = batchq.App(redis_url, namespace=namespace)

    @app.task(queue=QUEUE)
    async def ok(i: int) -> None:
        await asyncio.sleep(0.001)

    @app.task(queue=QUEUE, max_attempts=2, retry_backoff_s=0.05, retry_backoff_max_s=0.1)
    async def fail(i: int) -> None:
        raise ValueError(f"fail {i}")

    @app.task(queue=QUEUE, timeout_s=0.1, max_attempts=1)
    async def sleepy(i: int) -> None:
        await asyncio.sleep(2.0)

    @app.task(queue=QUEUE)
    async def later(i: int) -> None:
        await asyncio.sleep(0.001)

    # a schedule whose latest tick (New Year) is always long past: skipped, never run
    # (no job in the counts), but its next run is exported for the dashboard and alert
    @app.periodic(cron="0 0 1 1 *", queue=QUEUE)
    def new_year() -> None:
        pass

    @app.task(queue=QUEUE, batch_size=1, max_attempts=3)
    async def hog(jobs: list[batchq.Job]) -> None:
        for job in jobs:
            app.redis.rpush(hog_key(namespace), job.attempt)
            if job.attempt == 1:
                time.sleep(HOG_BLOCK_S)  # deliberately blocks the event loop

    @app.task(queue=FLOW_QUEUE)
    async def limited(i: int) -> None:
        await asyncio.sleep(0.001)

    return app


app = (build(os.environ.get("BATCHQ_REDIS_URL"), os.environ["METRICS_APP_NS"])
       if os.environ.get("METRICS_APP_NS") else None)
