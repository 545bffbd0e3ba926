"""A cancel never stalls a tenant: cancelled jobs ahead of live ones in a limited group
(or queue) are dropped at pop speed, never charged a rate token or a concurrency slot,
and a worker never idles on its block timeout while jobs are ready.

Each case puts thousands of cancelled jobs (a cancelled campaign, or jobs cancelled one
by one) in front of a second campaign's jobs, then starts one real worker
(``batchq worker apps.flow_app:app``) and waits for the second campaign's jobs: they
must all run within a few times what they need at the limit, far below what dropping a
burst's worth of cancelled jobs per block timeout (5 s) would take. The bounds are
generous (a loaded machine), the failure they catch is minutes long.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis
from apps.flow_app import build
from helpers import CliProcess, drop_namespace, wait_until
from workers import WorkerProcs, worker_env

import batchq

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

CANCELLED = 3000
"""Cancelled jobs in front of the live ones."""
LIVE = 50
"""The second campaign's jobs."""


@dataclass(frozen=True)
class Run:
    token: str
    start: float
    end: float


def read_runs(path: Path) -> list[Run]:
    """The runs apps.flow_app recorded: ``<kind> <token> <group> <pid> <attempt> <start>
    <end>`` a line."""
    if not path.exists():
        return []
    rows = [line.split(" ") for line in path.read_text().splitlines()]
    return [Run(r[1], float(r[5]), float(r[6])) for r in rows if len(r) == 7]


@pytest.fixture
def log_path(tmp_path: Path) -> Path:
    return tmp_path / "runs.log"


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
    env = worker_env({"BATCHQ_REDIS_URL": redis_url, "BATCHQ_TEST_NS": namespace,
                      "BATCHQ_TEST_LOG": str(log_path)})
    with WorkerProcs("apps.flow_app:app", env) as procs:
        yield lambda queue, *extra: procs.start("-q", queue, *extra, timeout_s=30)


def fill(app: batchq.App, queue: str, group: str | None, *, by_id: bool = False,
         secs: float = 0.0) -> tuple[batchq.Campaign, batchq.Campaign]:
    """CANCELLED jobs of campaign "first" (cancelled: the campaign, or each job by id),
    then LIVE jobs of campaign "second", in one group (or none)."""
    work = app.tasks["work"].options(queue=queue, group=group)
    first, second = app.campaign("first"), app.campaign("second")
    ids = work.options(campaign=first).enqueue_many([(f"x{i}", secs)
                                                     for i in range(CANCELLED)])
    work.options(campaign=second).enqueue_many([(f"live{i}", secs) for i in range(LIVE)])
    if by_id:
        assert sum(app.cancel(j) for j in ids) == CANCELLED
        first.seal()
    else:
        assert first.cancel() == CANCELLED
    second.seal()
    return first, second


def run_second(start_worker: Callable[..., CliProcess], queue: str, log_path: Path,
               need_s: float, *extra: str) -> float:
    """Start a worker, wait for the LIVE jobs; returns the seconds they took from the
    worker's start (its start-up included), asserting the bound."""
    bound_s = 3 * need_s + 8
    t0 = time.monotonic()
    proc = start_worker(queue, *extra)

    def live_done() -> bool:
        return sum(r.token.startswith("live") for r in read_runs(log_path)) >= LIVE

    wait_until(live_done, timeout_s=bound_s, interval_s=0.05,
               message=f"the live jobs did not all run within {bound_s:.1f}s "
                       f"(ran {sum(1 for _ in read_runs(log_path))})\n"
                       f"{proc.read_log()[-2000:]}")
    took = time.monotonic() - t0
    assert not any(r.token.startswith("x") for r in read_runs(log_path))
    return took


def settled(first: batchq.Campaign, second: batchq.Campaign) -> None:
    wait_until(lambda: first.stats().pending == 0 and second.stats().pending == 0,
               timeout_s=20, message=f"{first.stats()} {second.stats()}")
    a, b = first.stats(), second.stats()
    assert (a.cancelled, a.succeeded) == (CANCELLED, 0)
    assert (b.succeeded, b.cancelled) == (LIVE, 0)


@pytest.mark.parametrize("by_id", [False, True], ids=["campaign", "by-id"])
def test_rate_limited_group(app: batchq.App, queue_name: str, start_worker, log_path,
                            redis_client: redis.Redis, by_id: bool) -> None:
    rate = 50
    app.queue(queue_name).limit(group="cust", rate_per_s=rate)
    first, second = fill(app, queue_name, "cust", by_id=by_id)
    run_second(start_worker, queue_name, log_path, LIVE / rate)
    settled(first, second)
    # no token was charged for a dropped job: the live ones took their own time only,
    # and the group's quota count is back to nothing
    k = app.keys(queue_name)
    assert not any(f.endswith(b":n") for f in redis_client.hkeys(k.gstate))


def test_concurrency_limited_group(app: batchq.App, queue_name: str, start_worker,
                                   log_path) -> None:
    conc, secs = 2, 0.02
    app.queue(queue_name).limit(group="cust", concurrency=conc)
    first, second = fill(app, queue_name, "cust", secs=secs)
    run_second(start_worker, queue_name, log_path, LIVE * secs / conc)
    settled(first, second)
    runs = read_runs(log_path)
    # never more than the limit at once (a dropped job took no slot, a live one did)
    edges = sorted([(r.start, 1) for r in runs] + [(r.end, -1) for r in runs])
    at_once = peak = 0
    for _, d in edges:
        at_once += d
        peak = max(peak, at_once)
    assert peak <= conc


def test_rate_limited_queue(app: batchq.App, queue_name: str, start_worker,
                            log_path) -> None:
    rate = 50
    app.queue(queue_name).limit(rate_per_s=rate)
    first, second = fill(app, queue_name, None)
    run_second(start_worker, queue_name, log_path, LIVE / rate)
    settled(first, second)


def test_sharded_queue(app: batchq.App, queue_name: str, start_worker, log_path) -> None:
    """A sharded queue: the plain jobs spread over the shards, the limited group's in
    one; a worker serving all of them stalls on none."""
    rate = 50
    q = app.queue(queue_name, shards=3)
    q.limit(group="cust", rate_per_s=rate)
    first, second = fill(app, queue_name, "cust")
    run_second(start_worker, queue_name, log_path, LIVE / rate)
    settled(first, second)
