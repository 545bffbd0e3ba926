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


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "slow: long-running test")
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
