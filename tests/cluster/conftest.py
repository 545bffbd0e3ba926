"""Fixtures for the Redis Cluster tests: one real 3-master Valkey cluster per module
(``batchq.dev.cluster.EmbeddedCluster``), queue names placed on chosen nodes, and worker
processes of ``cluster.cluster_app:app`` that record their runs in a file (outside
Redis)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis
from helpers import CliProcess
from redis.crc import key_slot
from workers import WorkerProcs
from workers import worker_env as worker_env_of

import batchq
from batchq.dev.cluster import EmbeddedCluster

from .cluster_app import build

APP_REF = "cluster.cluster_app:app"


@pytest.fixture(scope="module")
def cluster() -> Iterator[EmbeddedCluster]:
    with EmbeddedCluster(3) as c:
        yield c


def queue_slot(namespace: str, queue: str) -> int:
    """The hash slot of every key of ``queue`` (they share the tag ``{ns:queue}``)."""
    return int(key_slot(f"{{{namespace}:{queue}}}".encode()))


def queues_on_nodes(cluster: EmbeddedCluster, namespace: str, prefix: str = "q",
                    ) -> list[str]:
    """One queue name per node, in node order: the keys of the i-th name live on
    ``cluster.nodes[i]``."""
    found: dict[int, str] = {}
    i = 0
    while len(found) < len(cluster.nodes):
        name = f"{prefix}{i}"
        found.setdefault(cluster.slot_owner(queue_slot(namespace, name)), name)
        i += 1
    return [found[n] for n in range(len(cluster.nodes))]


def node_client(cluster: EmbeddedCluster, index: int) -> redis.Redis:
    """A plain client of one node (admin commands, CLIENT LIST, ...)."""
    return redis.Redis.from_url(cluster.node_url(index))


def read_runs(path: Path, kind: str | None = None) -> list[tuple[str, str, int, float]]:
    """``(kind, token, pid, time)`` of every recorded run (optionally of one kind)."""
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        k, token, pid, t = line.split(" ")
        if kind is None or k == kind:
            out.append((k, token, int(pid), float(t)))
    return out


@pytest.fixture
def log_path(tmp_path: Path) -> Path:
    return tmp_path / "runs.log"


@pytest.fixture
def flag_path(tmp_path: Path) -> Path:
    return tmp_path / "fixed.flag"


@pytest.fixture
def app(cluster: EmbeddedCluster, namespace: str, log_path: Path,
        flag_path: Path) -> Iterator[batchq.App]:
    """The test app in this process, on the cluster (same namespace as the workers)."""
    a = build(cluster.url, namespace, str(log_path), str(flag_path))
    yield a
    a.close()


@pytest.fixture
def worker_env(cluster: EmbeddedCluster, namespace: str, log_path: Path,
               flag_path: Path) -> dict[str, str | None]:
    return worker_env_of({
        "BATCHQ_REDIS_URL": cluster.url,
        "BATCHQ_TEST_NS": namespace,
        "BATCHQ_TEST_LOG": str(log_path),
        "BATCHQ_TEST_FLAG": str(flag_path),
    })


WorkerFactory = Callable[..., CliProcess]


@pytest.fixture
def start_worker(worker_env: dict[str, str | None]) -> Iterator[WorkerFactory]:
    """``start_worker(queues, *extra_args, serving=1)``: ``batchq worker`` of the cluster
    app; waits until ``serving`` worker processes logged that they serve. Any still
    running at teardown is SIGKILLed."""
    with WorkerProcs(APP_REF, worker_env) as procs:

        def start(queues: list[str], *extra: str, serving: int = 1) -> CliProcess:
            return procs.start("-q", ",".join(queues), *extra, serving=serving)

        yield start
