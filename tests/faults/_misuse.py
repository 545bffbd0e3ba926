"""The ``misuse`` fixture: a ``Fleet`` of ``faults.misuse_app:app`` (handlers and settings
that misuse results, durations, schedules and ``RateLimited``), on the session server."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from . import misuse_app
from ._fleet import Fleet

MISUSE_APP = "faults.misuse_app:app"


@pytest.fixture
def misuse(redis_url: str, namespace: str, tmp_path: Path) -> Iterator[Fleet]:
    runs = tmp_path / "runs"
    runs.mkdir()
    r = redis.Redis.from_url(redis_url)
    fleet = Fleet(redis_url, namespace, runs, r,
                  misuse_app.build(redis_url, namespace, None))
    fleet.app_ref = MISUSE_APP
    yield fleet
    fleet.cleanup()
    r.close()
