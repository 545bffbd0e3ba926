"""Fixtures of the fault tests: ``fleet`` (a Fleet on the session server) and
``fleet_on(url)`` for tests that bring their own server or proxy.

Tests marked ``slow`` (the 10 s outage, the million delayed jobs) are skipped unless
they are asked for: ``-m slow`` (or any ``-m`` expression naming ``slow`` without
``not``), or ``BATCHQ_SLOW=1``. ``pytest tests/faults`` is the quick set.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis

from ._fleet import Fleet, build_app

FleetFactory = Callable[..., Fleet]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    expr = config.getoption("markexpr", "") or ""
    if os.environ.get("BATCHQ_SLOW") == "1" or ("slow" in expr and "not slow" not in expr):
        return
    skip = pytest.mark.skip(reason="slow: run with -m slow or BATCHQ_SLOW=1")
    for item in items:
        if "slow" in item.keywords and "/faults/" in str(item.fspath):
            item.add_marker(skip)


@pytest.fixture
def fleet_on(namespace: str, tmp_path: Path) -> Iterator[FleetFactory]:
    """``fleet_on(url, direct_url=None, **app_kw)``: a Fleet whose workers use ``url``;
    ``direct_url`` (default ``url``) is where the test inspects Redis; ``app_kw`` go to
    the producer's app (``socket_timeout_s``)."""
    made: list[Fleet] = []

    def make(url: str, direct_url: str | None = None, producer_url: str | None = None,
             **app_kw: object) -> Fleet:
        runs = tmp_path / f"runs{len(made)}"
        runs.mkdir()
        r = redis.Redis.from_url(direct_url or url)
        f = Fleet(url, namespace, runs, r, build_app(producer_url or url, namespace, **app_kw))
        made.append(f)
        return f

    yield make
    for f in made:
        f.cleanup()
        f.r.close()


@pytest.fixture
def fleet(redis_url: str, fleet_on: FleetFactory) -> Fleet:
    return fleet_on(redis_url)
