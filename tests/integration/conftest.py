"""Fixtures for integration tests: real worker processes on the real server.

Workers run ``python -m batchq worker apps.basic:app`` (tests/apps/basic.py); every
handler appends a line to a per-test log file (outside Redis), read back with ``runs()``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest
import redis
from apps.basic import build
from helpers import CliProcess, drop_namespace
from workers import WorkerProcs
from workers import worker_env as worker_env_of

import batchq

from ._support import Run, read_runs

HERE = Path(__file__).resolve().parent
APP_REF = "apps.basic:app"


@pytest.fixture
def log_path(tmp_path: Path) -> Path:
    return tmp_path / "runs.log"


@pytest.fixture
def runs(log_path: Path) -> Callable[..., list[Run]]:
    """``runs(kind=None)``: the log lines so far (optionally of one kind)."""

    def get(kind: str | None = None) -> list[Run]:
        return [r for r in read_runs(log_path) if kind is None or r.kind == kind]

    return get


@pytest.fixture
def worker_env(redis_url: str, namespace: str, log_path: Path) -> dict[str, str | None]:
    return worker_env_of({
        "BATCHQ_REDIS_URL": redis_url,
        "BATCHQ_TEST_NS": namespace,
        "BATCHQ_TEST_LOG": str(log_path),
    })


@pytest.fixture
def app(redis_url: str, namespace: str, log_path: Path,
        redis_client: redis.Redis) -> Iterator[batchq.App]:
    """The test app in this process (same tasks and namespace as the workers)."""
    a = build(redis_url, namespace, str(log_path))
    yield a
    a.close()
    drop_namespace(redis_client, namespace)


WorkerFactory = Callable[..., CliProcess]


@pytest.fixture
def start_worker(worker_env: dict[str, str | None]) -> Iterator[WorkerFactory]:
    """``start_worker(queues, *extra_args, wait_ready=True, env=None)``: a worker
    process of apps.basic:app (``wait_ready``: wait until it serves; a ``--burst`` worker
    may have finished by then); any still running at teardown is SIGKILLed."""
    with WorkerProcs(APP_REF, worker_env) as procs:

        def start(queues: str | Sequence[str], *extra: str, wait_ready: bool = True,
                  env: dict[str, str | None] | None = None) -> CliProcess:
            qs = queues if isinstance(queues, str) else ",".join(queues)
            return procs.start("-q", qs, *extra, env=env, serving=int(wait_ready),
                               timeout_s=20)

        yield start
