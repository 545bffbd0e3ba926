"""The worker process's garbage collector (``--gc-threshold``, ``worker.tune_gc``): a
real ``batchq worker`` process reports it from inside a handler."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from apps.results_app import QUEUE, build
from fixtures.basic import *  # noqa: F403
from helpers import drop_namespace, run_cli
from workers import WorkerProcs, worker_env

import batchq
from batchq.worker.state import GC_THRESHOLD

pytestmark = pytest.mark.integration

APP_REF = "apps.results_app:app"


@pytest.fixture
def app(redis_url: str, namespace: str, tmp_path: Path,
        redis_client: redis.Redis) -> Iterator[batchq.App]:
    a = build(redis_url, namespace, str(tmp_path / "runs.log"))
    yield a
    a.close()
    drop_namespace(redis_client, namespace)


@pytest.fixture
def workers(redis_url: str, namespace: str) -> Iterator[WorkerProcs]:
    env = worker_env({"BATCHQ_REDIS_URL": redis_url, "BATCHQ_TEST_NS": namespace})
    with WorkerProcs(APP_REF, env) as procs:
        yield procs


def _state(app: batchq.App, workers: WorkerProcs, *flags: str,
           env: dict[str, str | None] | None = None) -> dict[str, object]:
    jid = app.tasks["gc_state"].enqueue()
    proc = workers.start("-q", QUEUE, "--burst", *flags, env=env, serving=0)
    assert proc.wait(30) == 0, proc.read_log()
    state = app.result(jid, timeout_s=5)
    assert isinstance(state, dict)
    return state


def test_the_worker_tunes_the_collector_and_still_collects_cycles(
        app: batchq.App, workers: WorkerProcs) -> None:
    state = _state(app, workers)
    assert state["threshold"][0] == GC_THRESHOLD  # type: ignore[index]
    assert state["frozen"] > 1000  # type: ignore[operator]  # imports, the app
    assert state["enabled"] is True and state["cycle_freed"] is True
    # the flag and its environment variable set it; 0 leaves Python's own collector
    assert _state(app, workers, "--gc-threshold", "5000")["threshold"][0] == 5000  # type: ignore[index]
    env_set = _state(app, workers, env={"BATCHQ_GC_THRESHOLD": "2500"})
    assert env_set["threshold"][0] == 2500  # type: ignore[index]
    left = _state(app, workers, "--gc-threshold", "0")
    # Python's own threshold, read in a fresh interpreter: this test process's may have
    # been tuned by an in-process worker run of another test
    fresh = subprocess.run([sys.executable, "-c", "import gc; print(list(gc.get_threshold()))"],
                           capture_output=True, text=True, check=True).stdout.strip()
    assert str(left["threshold"]) == fresh and left["frozen"] == 0
    assert left["cycle_freed"] is True


@pytest.mark.parametrize("value", ["-1", "many"])
def test_a_bad_gc_threshold_exits_2(value: str) -> None:
    res = run_cli(["worker", APP_REF, "--gc-threshold", value])
    assert res.returncode == 2, res
    assert "--gc-threshold" in res.stderr and "Traceback" not in res.stderr
