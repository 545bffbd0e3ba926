"""A small app for the operator-command tests (``batchq info``, ``dead``, ``enqueue`` ...).

``python -m batchq ... tests.apps.ops_app:app`` builds it from ``$BATCHQ_REDIS_URL`` and
``$BATCHQ_NAMESPACE``; tests build their own copy in-process with ``build(url, ns)``.
"""

from __future__ import annotations

import os

import batchq


def build(redis_url: str | None, namespace: str) -> batchq.App:
    app = batchq.App(redis_url, namespace=namespace)

    @app.task
    def add(a: int, b: int = 0) -> int:
        return a + b

    @app.task(max_attempts=1)
    def explode(token: str) -> None:
        raise ValueError(f"boom {token}")

    @app.task(queue="side")
    def side(x: int) -> None:
        pass

    @app.task(queue="bulk")
    def record(n: int, tag: str = "") -> None:
        pass

    return app


app = build(os.environ.get("BATCHQ_REDIS_URL"), os.environ.get("BATCHQ_NAMESPACE", "batchq"))
