"""Shared fixtures: one Redis/Valkey per session, unique names per test."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from uuid import uuid4

import pytest
import redis

REPO_ROOT = Path(__file__).resolve().parent.parent
for _path in (REPO_ROOT, REPO_ROOT / "tests"):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

import helpers  # noqa: E402
import reaper  # noqa: E402

from batchq.dev.server import EmbeddedServer  # noqa: E402

TEST_REDIS_URL_ENV = "BATCHQ_TEST_REDIS_URL"


# --- layers: a marker on each test module (``pytestmark``); tests/README.md -------------
LAYERS = {
    "unit": "no Redis, no process: pure functions and static checks",
    "script": "one Lua script called directly on the session's Redis",
    "integration": "the API and real worker processes against a real Redis",
    "e2e": "the real CLI or a real service process, end to end",
    "fault": "a fault injected: kills, outages, hostile input, misuse",
}
TOPOLOGY = {"cluster": "runs on the embedded 3-master Redis Cluster"}
REDIS_FIXTURES = ("redis_url", "redis_client")


def _layer(item: pytest.Item) -> str | None:
    for mark in item.iter_markers():
        if mark.name in LAYERS:
            return mark.name
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Slow tests are skipped unless asked for (``-m slow``, or any ``-m`` naming ``slow``
    without ``not``, or ``BATCHQ_SLOW=1``); a ``unit`` test that takes a Redis fixture is
    a collection error."""
    wrong = [f"{item.nodeid} uses {name}" for item in items if _layer(item) == "unit"
             for name in REDIS_FIXTURES if name in item.fixturenames]
    if wrong:
        raise pytest.UsageError("unit tests must not use Redis (mark them integration):\n"
                                + "\n".join(wrong))
    expr = config.getoption("markexpr", "") or ""
    if os.environ.get("BATCHQ_SLOW") == "1" or ("slow" in expr and "not slow" not in expr):
        return
    skip = pytest.mark.skip(reason="slow: run with -m slow or BATCHQ_SLOW=1")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "slow: long-running test")
    for name, what in {**LAYERS, **TOPOLOGY}.items():
        config.addinivalue_line("markers", f"{name}: {what}")
    reaper.start()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    helpers.cleanup_started()


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    """URL of the Redis used by the tests.

    ``BATCHQ_TEST_REDIS_URL`` (a dedicated db, flushed at session start) if
    set, otherwise an embedded Valkey started for the session.
    """
    external = os.environ.get(TEST_REDIS_URL_ENV)
    if external:
        client = redis.Redis.from_url(external)
        try:
            client.flushdb()
        finally:
            client.close()
        yield external
        return
    with EmbeddedServer() as server:
        yield server.url


@pytest.fixture
def redis_client(redis_url: str) -> Iterator[redis.Redis]:
    """Synchronous client on ``redis_url`` (bytes responses)."""
    client = redis.Redis.from_url(redis_url, decode_responses=False)
    try:
        yield client
    finally:
        client.close()


@pytest.fixture
def queue_name() -> str:
    """A queue name unique to this test."""
    return f"t{uuid4().hex[:10]}"


@pytest.fixture
def namespace() -> str:
    """A key namespace unique to this test."""
    return f"ns{uuid4().hex[:10]}"
