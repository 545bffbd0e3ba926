"""The app of the misuse fault tests (``apps.misuse_app:app``): handlers and settings
that misuse results, durations, schedules and ``RateLimited``.

Records runs like ``fault_app`` (``$FAULT_RUNS/runs-<pid>.log``, read by
``tests/checker.py``); namespace from ``$FAULT_NS``. Each test serves its own queue:

* ``plain`` (queue ``plain``): a task without ``result_ttl_s``;
* ``mixed_plain`` / ``mixed_kept`` (queue ``mixed``): one keeps results, one does not;
* ``kept`` / ``huge_ttl`` (queue ``kept``): keep results; ``huge_ttl``'s TTL is changed
  after the decorator checked it (1e17 s), so Redis refuses every write of its result;
* ``rl_nosuper``, ``rl_zero``, ``rl_long`` (queue ``rl``): a ``RateLimited`` subclass
  that skips ``super().__init__()`` (first run only), ``RateLimited(0)`` on every run,
  ``RateLimited(3600)`` on the first run of a token starting with ``hold``;
* with ``$MISUSE_PERIODIC=1``: ``tick`` (``every_s=1``, queue ``periodic``) and
  ``feb30``, whose schedule is changed after registration to 30 February (never fires).
"""

from __future__ import annotations

import os
from typing import Any

import batchq
from apps.fault_app import Recorder
from batchq.produce.periodic import schedules


class NoSuper(batchq.RateLimited):
    """A subclass whose ``__init__`` never calls ``super().__init__()``: no
    ``retry_after_s``."""

    def __init__(self) -> None:  # deliberately no super().__init__()
        self.why = "forgot super"


def build(redis_url: str | None, namespace: str, runs_dir: str | None,
          periodic: bool = False) -> batchq.App:
    app = batchq.App(redis_url, namespace=namespace)
    rec = Recorder(runs_dir)

    def once(name: str, token: Any) -> bool:
        return rec.first_time(f"{name}-{token}")

    @app.task(queue="plain")
    async def plain(token: str) -> str:
        rec.end(token, "-", 0, rec.start(token, "-", 0))
        return token

    @app.task(queue="mixed")
    async def mixed_plain(token: str) -> str:
        rec.end(token, "-", 0, rec.start(token, "-", 0))
        return token

    @app.task(queue="mixed", result_ttl_s=60)
    async def mixed_kept(token: str) -> str:
        rec.end(token, "-", 0, rec.start(token, "-", 0))
        return token

    @app.task(queue="kept", result_ttl_s=60)
    async def kept(token: str) -> str:
        rec.end(token, "-", 0, rec.start(token, "-", 0))
        return f"value-{token}"

    @app.task(queue="kept", result_ttl_s=60, max_attempts=3)
    async def huge_ttl(token: str) -> str:
        rec.end(token, "-", 0, rec.start(token, "-", 0))
        return f"value-{token}"

    # past the decorator's check, as a hostile plugin could: 1e17 s
    huge_ttl.result_ttl_ms = 10**20

    @app.task(queue="rl", batch_size=1, max_attempts=1)
    async def rl_nosuper(jobs: list[batchq.Job]) -> None:
        for job in jobs:
            token = job.args[0]
            t0 = rec.start(token, job.id, job.attempt)
            if once("nosuper", token):
                raise NoSuper()
            rec.end(token, job.id, job.attempt, t0)

    @app.task(queue="rl", batch_size=1, max_attempts=2, max_refunds=3)
    async def rl_zero(jobs: list[batchq.Job]) -> None:
        for job in jobs:
            rec.start(job.args[0], job.id, job.attempt)
            raise batchq.RateLimited(0)

    @app.task(queue="rl", batch_size=1, max_attempts=1)
    async def rl_long(jobs: list[batchq.Job]) -> None:
        for job in jobs:
            token = job.args[0]
            t0 = rec.start(token, job.id, job.attempt)
            if str(token).startswith("hold") and once("long", token):
                raise batchq.RateLimited(3600)
            rec.end(token, job.id, job.attempt, t0)

    if periodic:
        @app.periodic(every_s=1, queue="periodic")
        async def tick() -> None:
            rec.end("tick", "-", 0, rec.start("tick", "-", 0))

        @app.periodic(cron="0 0 1 1 *", queue="periodic")
        async def feb30() -> None:
            rec.end("feb30", "-", 0, rec.start("feb30", "-", 0))

        s = next(s for s in schedules(app) if s.name == "feb30")
        object.__setattr__(s, "cron", "0 0 30 2 *")  # past the registration check

    return app


app = (
    build(os.environ.get("BATCHQ_REDIS_URL"), os.environ["FAULT_NS"],
          os.environ.get("FAULT_RUNS"), os.environ.get("MISUSE_PERIODIC") == "1")
    if os.environ.get("FAULT_NS") else None
)
