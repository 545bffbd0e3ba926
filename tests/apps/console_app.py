"""The app behind the web console tests (``apps.console_app:app`` for worker processes).

Built from ``$BATCHQ_REDIS_URL`` and ``$BATCHQ_NAMESPACE``; the tests build their own
copy in-process with ``build(url, ns)``. ``flaky`` fails until the test sets
``<ns>:test:fixed``, then records its token in ``<ns>:test:ran``: a dead job retried
from the page can be seen to run.
"""

from __future__ import annotations

import os

import redis

import batchq


def build(redis_url: str | None, namespace: str) -> batchq.App:
    app = batchq.App(redis_url, namespace=namespace)
    client = redis.Redis.from_url(app.redis_url)

    @app.task(max_attempts=1)
    def explode(token: str) -> None:
        raise ValueError(f"boom {token}")

    @app.task(max_attempts=1)
    def flaky(token: str) -> None:
        if not client.exists(f"{namespace}:test:fixed"):
            raise RuntimeError(f"not fixed yet: {token}")
        client.rpush(f"{namespace}:test:ran", token)

    @app.task(queue="side")
    def side(n: int) -> None:
        pass

    @app.task(queue="bulk")
    def record(n: int) -> None:
        pass

    app.breaker("sms", failures=3, within_s=10, open_s=600)

    @app.task(queue="bulk")
    def sms_backup(n: int) -> None:
        pass

    @app.task(queue="bulk", breaker="sms", fallback=sms_backup)
    def sms(n: int) -> None:
        pass

    @app.periodic(every_s=3600, queue="side")
    def hourly() -> None:
        pass

    return app


app = build(os.environ.get("BATCHQ_REDIS_URL"), os.environ.get("BATCHQ_NAMESPACE", "batchq"))
