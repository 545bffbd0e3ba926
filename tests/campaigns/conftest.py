"""Fixtures of the campaign and dedup-key tests: an in-process app whose tasks record
what ran in Redis (a list per test), and in-process burst workers."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from typing import Any

import msgpack
import pytest
import redis
from helpers import app_in_namespace

import batchq


def make_app(url: str, ns: str) -> batchq.App:
    app = batchq.App(url, namespace=ns)

    @app.task(queue="a", max_attempts=2, retry_backoff_s=0)
    def send(n: int, fail: bool = False) -> None:
        app.redis.rpush(f"{ns}:ran", n)
        if fail:
            raise RuntimeError(f"fail {n}")

    @app.task(queue="b")
    def other(n: int) -> None:
        app.redis.rpush(f"{ns}:ran", n)

    @app.task(queue="cb")
    def report(campaign_id: str, stats: dict[str, Any]) -> None:
        app.redis.rpush(f"{ns}:done", msgpack.packb([campaign_id, stats]))

    return app


@pytest.fixture
def app(redis_url: str, namespace: str, redis_client: redis.Redis) -> Iterator[batchq.App]:
    yield from app_in_namespace(make_app, redis_url, namespace, redis_client)


@pytest.fixture
def drain(app: batchq.App) -> Callable[..., None]:
    """``drain(*queues)``: run a burst worker in this process until they are empty."""

    def run(*queues: str) -> None:
        s = batchq.WorkerSettings(queues=queues or ("a", "b", "cb"), burst=True,
                                  install_signal_handlers=False, metrics=False,
                                  concurrency=20)
        asyncio.run(batchq.Worker(app, s).run())

    return run


def completions(r: redis.Redis, ns: str) -> list[tuple[str, dict[str, Any]]]:
    return [tuple(msgpack.unpackb(x)) for x in r.lrange(f"{ns}:done", 0, -1)]  # type: ignore[misc]
