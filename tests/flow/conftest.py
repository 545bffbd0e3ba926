"""Fixtures of the flow-control tests: the flow app in this process and real workers of
it (``batchq worker apps.flow_app:app``), each handler's run read back from a log file
with the handler's own clock."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis
from apps.flow_app import build
from helpers import CliProcess, drop_namespace
from workers import WorkerProcs, worker_env

import batchq

APP_REF = "apps.flow_app:app"


@dataclass(frozen=True)
class Run:
    kind: str
    token: str
    group: str
    pid: int
    attempt: int
    start: float
    end: float


def read_runs(path: Path) -> list[Run]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        kind, token, group, pid, attempt, start, end = line.split(" ")
        out.append(Run(kind, token, group, int(pid), int(attempt), float(start), float(end)))
    return sorted(out, key=lambda r: r.start)


@pytest.fixture
def log_path(tmp_path: Path) -> Path:
    return tmp_path / "runs.log"


@pytest.fixture
def runs(log_path: Path) -> Callable[[], list[Run]]:
    return lambda: read_runs(log_path)


@pytest.fixture
def app(redis_url: str, namespace: str, log_path: Path,
        redis_client: redis.Redis) -> Iterator[batchq.App]:
    a = build(redis_url, namespace, str(log_path))
    yield a
    a.close()
    drop_namespace(redis_client, namespace)


@pytest.fixture
def start_worker(redis_url: str, namespace: str, log_path: Path
                 ) -> Iterator[Callable[..., CliProcess]]:
    """``start_worker(queue, *extra)``: a worker of apps.flow_app:app serving ``queue``."""
    env = worker_env({"BATCHQ_REDIS_URL": redis_url, "BATCHQ_TEST_NS": namespace,
                      "BATCHQ_TEST_LOG": str(log_path)})
    with WorkerProcs(APP_REF, env) as procs:
        def start(queue: str, *extra: str) -> CliProcess:
            return procs.start("-q", queue, *extra, serving=0 if "--burst" in extra else 1,
                               timeout_s=20)
        yield start
