"""Circuit breakers shared by the fleet, and per-job timeouts, with real worker processes
of tests/apps/sendctl_app.py: a breaker trips on failures from two processes, holds the
jobs of a task bound to it (attempts not charged), half-opens, lets probes decide and
closes; a bound task with a fallback has its jobs re-routed while it is open, each job
run exactly once across primary and fallback."""

from __future__ import annotations

import collections
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from apps.sendctl_app import build
from fixtures.basic import *  # noqa: F403
from fixtures.runs import Run, read_runs
from helpers import drop_namespace, start_cli, wait_until
from workers import WorkerProcs, worker_env

import batchq
from batchq.flow import breaker
from batchq.ops import audit
from batchq.store import codec

pytestmark = pytest.mark.integration

APP_REF = "apps.sendctl_app:app"
Q = "sc"


@pytest.fixture
def app(redis_url: str, namespace: str, log_path: Path,
        redis_client: redis.Redis) -> Iterator[batchq.App]:
    a = build(redis_url, namespace, str(log_path))
    yield a
    a.close()
    drop_namespace(redis_client, namespace)


@pytest.fixture
def workers(redis_url: str, namespace: str, log_path: Path) -> Iterator[WorkerProcs]:
    env = worker_env({"BATCHQ_REDIS_URL": redis_url, "BATCHQ_TEST_NS": namespace,
                      "BATCHQ_TEST_LOG": str(log_path)})
    with WorkerProcs(APP_REF, env) as procs:
        yield procs


def _kinds(log_path: Path) -> collections.Counter[str]:
    return collections.Counter(r.kind for r in read_runs(log_path))


def _runs(log_path: Path, kind: str) -> list[Run]:
    return [r for r in read_runs(log_path) if r.kind == kind]


def test_per_job_timeout_overrides_the_tasks(app, workers, log_path):
    q = app.queue(Q)
    nap = app.tasks["nap"]
    short = nap.options(timeout_s=0.2).enqueue("short", 1.0)
    nap.enqueue("plain", 0.5)
    sync_short = app.tasks["sync_nap"].options(timeout_s=0.2).enqueue("sshort", 1.0)
    workers.start("-q", Q, "-c", "4")
    wait_until(lambda: q.stats().pending == 0 and q.stats().dead == 2, timeout_s=30,
               message=str(q.stats()))
    dead = {d.id: d for d in q.dead_jobs()}
    assert set(dead) == {short, sync_short}
    assert {d.reason for d in dead.values()} == {"timeout"}
    assert "0.2s" in dead[short].error_message
    assert [r.token for r in _runs(log_path, "nap")] == ["plain"]  # 0.5 s < the task's 10


def test_breaker_trips_across_two_processes_then_half_opens_and_closes(
        app, workers, log_path, redis_client, namespace):
    b = app.breakers["prov"]
    redis_client.set(f"{namespace}:down", 1)
    workers.start("-q", Q, "-c", "2")
    workers.start("-q", Q, "-c", "2")
    call = app.tasks["call"]
    call.enqueue_many([f"c{i}" for i in range(5)])
    wait_until(lambda: b.state().state == "open", timeout_s=20,
               message=f"{b.state()} {_kinds(log_path)}")
    fails = _runs(log_path, "call_fail")
    assert len(fails) == 5
    assert len({r.pid for r in fails}) == 2, "both processes fed one breaker"
    st = b.state()
    assert st.trips == 1 and st.open_left_s > 0
    # while open, a call is refused before it reaches the provider (BreakerOpen): its
    # job is held until the breaker half-opens, not failed
    redis_client.delete(f"{namespace}:down")
    time.sleep(2 * breaker.CLOSED_CACHE_S)  # both processes have seen it open
    q = app.queue(Q)
    call.enqueue("held")
    wait_until(lambda: q.stats().delayed == 1, timeout_s=20, message=str(q.stats()))
    assert b.state().state == "open" and _kinds(log_path)["call"] == 0
    # provider back: after open_s it half-opens, two probes succeed, it closes
    wait_until(lambda: b.state().state != "open", timeout_s=20)
    call.enqueue_many([f"p{i}" for i in range(4)])
    wait_until(lambda: _kinds(log_path)["call"] == 5, timeout_s=20,
               message=f"{b.state()} {q.stats()} {_kinds(log_path)}")
    assert b.state().state == "closed"
    assert sorted(r.token for r in _runs(log_path, "call")) == \
        ["held", "p0", "p1", "p2", "p3"]
    assert q.stats().dead == 5 and b.state().trips == 1


def test_bound_jobs_are_held_while_open_and_run_after_without_charge(
        app, workers, log_path, redis_client, namespace):
    b = app.breakers["prov"]
    q = app.queue(Q)
    workers.start("-q", Q, "-c", "4")
    workers.start("-q", Q, "-c", "4")
    b.open(4.0)
    ids = app.tasks["bound"].enqueue_many([f"b{i}" for i in range(20)])
    # held: back in the delayed set, not run, not failed
    wait_until(lambda: q.stats().delayed == 20, timeout_s=20, message=str(q.stats()))
    assert _kinds(log_path)["bound"] == 0 and q.stats().dead == 0
    # their attempt refunded: each waits as a fresh job (header attempt 0)
    held = redis_client.zrange(app.keys(Q).delayed, 0, -1)
    assert sorted(codec.parse_header(e)[1] for e in held) == [0] * 20
    # after the open time: half-open probes succeed, it closes, every job runs once
    wait_until(lambda: _kinds(log_path)["bound"] == 20, timeout_s=30,
               message=f"{q.stats()} {b.state()} {_kinds(log_path)}")
    assert sorted(r.token for r in _runs(log_path, "bound")) == \
        sorted(f"b{i}" for i in range(20))
    # max_attempts=1: a charged hold would have dead-lettered them
    wait_until(lambda: q.stats().pending == 0, timeout_s=10)
    assert q.stats().dead == 0 and len(set(ids)) == 20
    assert b.state().state == "closed"


def test_fallback_reroute_runs_each_job_exactly_once(app, workers, log_path, redis_client,
                                                     namespace):
    b = app.breakers["prov"]
    q = app.queue(Q)
    n = 200
    routed = app.tasks["routed"]
    campaign = app.campaign()
    ids = routed.options(campaign=campaign).enqueue_many([f"r{i}" for i in range(n)])
    campaign.seal()
    b.open(30.0)
    redis_client.set(f"{namespace}:down", 1)
    workers.start("-q", Q, "-c", "8")
    workers.start("-q", Q, "-c", "8")
    wait_until(lambda: q.stats().pending == 0, timeout_s=60, message=str(q.stats()))
    kinds = _kinds(log_path)
    assert kinds, workers.procs[0].read_log()
    tokens = [r.token for r in read_runs(log_path) if r.kind in ("routed", "backup")]
    assert sorted(tokens) == sorted(f"r{i}" for i in range(n)), kinds
    assert kinds["routed_fail"] == 0 and kinds["backup"] == n
    assert q.stats().dead == 0
    st = campaign.stats()
    assert (st.succeeded, st.pending) == (n, 0)
    k = app.keys(Q)
    assert int(redis_client.hget(k.stats, "rerouted:routed")) == n
    assert len(set(ids)) == n
    fams = {m.name: m for m in breaker.BreakerCollector(app).collect()}
    assert [(s.labels, s.value) for s in fams["batchq_breaker_state"].samples] == \
        [({"name": "prov"}, 1)]
    moved = {s.labels["task"]: s.value for s in fams["batchq_jobs_rerouted"].samples
             if s.name == "batchq_jobs_rerouted_total"}
    assert moved == {"bound": 0, "routed": n}


def test_breaker_cli_ls_open_close_and_audit(app, redis_url, namespace, redis_client):
    env = worker_env({"BATCHQ_REDIS_URL": redis_url, "BATCHQ_TEST_NS": namespace})

    def cli(*args: str) -> tuple[int, str]:
        p = start_cli(["breaker", *args], env=env)
        code = p.wait(timeout=30)
        return code, p.read_log()

    code, out = cli("ls", APP_REF)
    assert code == 0 and "prov" in out and "closed" in out, out
    code, out = cli("open", APP_REF, "prov", "--open-s", "60")
    assert code == 0, out
    assert app.breakers["prov"].state().state == "open"
    code, out = cli("ls", APP_REF, "--json")
    assert code == 0 and '"state": "open"' in out, out
    code, out = cli("close", APP_REF, "prov")
    assert code == 0, out
    assert app.breakers["prov"].state().state == "closed"
    code, out = cli("open", APP_REF, "nope")
    assert code == 2 and "Traceback" not in out and "nope" in out, out
    actions = [r.action for r in audit.read(app.redis, namespace, 10)]
    assert "breaker_open" in actions and "breaker_close" in actions, actions


def test_bad_breaker_settings_are_refused(app):
    with pytest.raises(ValueError, match="breaker name"):
        app.breaker("x" * 65, failures=1)
    with pytest.raises(ValueError, match="failures"):
        app.breaker("zero", failures=0)
    with pytest.raises(ValueError, match="no breaker named"):
        app.breaker("undefined")

    async def h() -> None: ...

    with pytest.raises(ValueError, match="not a task registered"):
        app.task(name="t1", queue=Q, breaker="prov", fallback="missing")(h)
    with pytest.raises(ValueError, match="no breaker named"):
        app.task(name="t2", queue=Q, breaker="other")(h)
    with pytest.raises(ValueError, match="re-routed within its queue"):
        app.task(name="t3", queue="elsewhere", breaker="prov", fallback="backup")(h)
    assert not {"t1", "t2", "t3"} & set(app.tasks)
