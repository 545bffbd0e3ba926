"""Holds made visible and releasable: ``Queue.hold`` / ``Queue.release`` / ``Queue.holds``,
``batchq hold`` / ``release`` / ``resume`` through the real CLI, and a queue held for an
hour by a handler's ``RateLimited`` lifted by ``batchq release`` while a real worker
waits on it."""

from __future__ import annotations

import json
import subprocess

import pytest
from fixtures.flow import *  # noqa: F403
from helpers import run_cli, wait_until
from workers import worker_env

import batchq
from batchq.flow.limits import Holds, group_hex

pytestmark = pytest.mark.integration

APP = "apps.flow_app:app"


@pytest.fixture
def env(redis_url: str, namespace: str) -> dict[str, str | None]:
    return worker_env({"BATCHQ_REDIS_URL": redis_url, "BATCHQ_NAMESPACE": namespace,
                       "BATCHQ_TEST_NS": namespace})


def cli(args: list[str], env: dict[str, str | None], code: int = 0,
        ) -> subprocess.CompletedProcess[str]:
    res = run_cli(args, env=env, timeout_s=30)
    assert res.returncode == code, (
        f"batchq {' '.join(args)}: exit {res.returncode}, expected {code}\n"
        f"stdout:\n{res.stdout}\nstderr:\n{res.stderr}")
    assert "Traceback" not in res.stderr, res.stderr
    return res


def test_queue_hold_release_round_trip(app: batchq.App, queue_name: str) -> None:
    q = app.queue(queue_name)
    k = app.keys(queue_name)
    r = app.clients.redis
    assert q.holds() == Holds()
    left = q.hold(600)
    assert 590 < left <= 600
    h = q.holds()
    assert 590 < h.queue_s <= 600 and h.queue_why == "operator" and h.groups == 0
    assert q.hold(60) > 590  # a longer hold is kept
    r.delete(k.wake)
    assert 590 < q.release() <= 600
    assert r.llen(k.wake) == 1  # an idle worker is woken at once
    assert q.holds().queue_s == 0
    assert q.release() == 0.0  # nothing left to release
    assert r.hget(k.gstate, "~q:why") is None


def test_group_hold_release_shows_why(app: batchq.App, queue_name: str) -> None:
    q = app.queue(queue_name)
    work = app.tasks["work"].options(queue=queue_name)
    work.options(group="acme").enqueue_many([("a1",), ("a2",)])
    work.options(group="other").enqueue("o1")
    q.hold(300, group="acme")
    h = q.holds()
    assert h.groups == 1 and h.queue_s == 0
    waiting = {g.group: g for g in q.groups() if g.state == "waiting"}
    assert waiting["acme"].why == "operator" and waiting["acme"].until_s > 290
    assert 290 < q.release(group="acme") <= 300
    assert q.holds().groups == 0
    assert all(g.state != "waiting" for g in q.groups())
    # a reason left from an earlier hold never names a later wait (a rate token's)
    k, r = app.keys(queue_name), app.clients.redis
    q.hold(0.2, group="acme")
    sec, usec = r.time()
    r.zadd(k.gwait, {group_hex("acme"): sec * 1000 + usec // 1000 + 5000})
    (g,) = [g for g in q.groups() if g.state == "waiting"]
    assert g.group == "acme" and g.why == ""
    with pytest.raises(ValueError):
        q.hold(0, group="acme")
    with pytest.raises(ValueError):
        q.hold(86400 * 2)


def test_cli_hold_resume_release(app: batchq.App, queue_name: str,
                                 env: dict[str, str | None]) -> None:
    q = app.queue(queue_name)
    app.tasks["work"].options(queue=queue_name, group="acme").enqueue("a")
    res = cli(["hold", APP, queue_name, "3600"], env)
    assert f"queue {queue_name} is held until" in res.stdout
    assert f"batchq release {queue_name} lifts it" in res.stdout
    cli(["hold", APP, queue_name, "120", "--group", "acme"], env)

    res = cli(["resume", APP, queue_name], env)
    assert "is running" not in res.stdout
    assert "is not paused, but it is held" in res.stdout
    assert "by an operator (batchq hold)" in res.stdout
    assert "1 group is held" in res.stdout
    out = json.loads(cli(["resume", APP, queue_name, "--json"], env).stdout)
    assert out["paused"] is False and out["held_why"] == "operator"
    assert 3500 < out["held_s"] <= 3600 and out["groups_held"] == 1

    info = json.loads(cli(["info", APP, "--json"], env).stdout)["queues"][queue_name]
    assert info["flow"]["held_why"] == "operator"
    (g,) = info["flow"]["waiting_groups"]
    assert g["group"] == "acme" and g["why"] == "operator"
    listing = cli(["limit", "list", APP, queue_name], env).stdout
    assert "(operator)" in listing

    res = cli(["release", APP, queue_name, "--group", "acme"], env)
    assert f"released queue {queue_name} group acme" in res.stdout
    res = cli(["release", APP, queue_name], env)
    assert f"released queue {queue_name} (its hold had" in res.stdout
    res = cli(["release", APP, queue_name, "--json"], env)
    assert json.loads(res.stdout)["released"] is False
    assert q.holds() == Holds()
    res = cli(["resume", APP, queue_name], env)
    assert "is running: workers take jobs from it" in res.stdout

    for bad in (["hold", APP, queue_name, "0"], ["hold", APP, queue_name, "nan"],
                ["hold", APP, queue_name, "1e20"], ["hold", APP, queue_name],
                ["release", APP, queue_name, "--group", ""]):
        res = cli(bad, env, code=2)
        assert len(res.stderr.strip().splitlines()) == 1, res.stderr


def test_paused_and_held_says_both(app: batchq.App, queue_name: str,
                                   env: dict[str, str | None]) -> None:
    app.tasks["work"].options(queue=queue_name).enqueue("a")
    app.queue(queue_name).hold(60)
    res = cli(["pause", APP, queue_name], env)
    assert "is paused" in res.stdout and "the whole queue is held" in res.stdout
    res = cli(["release", APP, queue_name], env)
    assert "released" in res.stdout and "is paused: batchq resume" in res.stdout


def test_rate_limited_queue_hold_released_by_cli(app: batchq.App, queue_name: str,
                                                 env: dict[str, str | None],
                                                 start_worker, runs) -> None:
    """A handler raising RateLimited(3600) without a group holds the whole queue for an
    hour; ``batchq resume`` says so and why, ``batchq release`` lifts it and the held
    jobs run at once."""
    q = app.queue(queue_name)
    t = app.tasks["throttled"].options(queue=queue_name)
    t.enqueue("first", 3600, True)
    start_worker(queue_name, "-c", "1")
    wait_until(lambda: any(r.kind == "limited" for r in runs()), timeout_s=20)
    wait_until(lambda: q.holds().queue_s > 100, timeout_s=10)  # held (capped by max_hold_s)
    t.enqueue_many([(f"n{i}", 0, False) for i in range(3)])
    assert q.holds().queue_why == "RateLimited"

    res = cli(["resume", APP, queue_name], env)
    assert "is running" not in res.stdout
    assert "by a handler that raised RateLimited" in res.stdout
    res = cli(["limit", "rm", APP, queue_name], env)
    assert "batchq release" in res.stdout  # a hold is not a limit: says what lifts it
    assert q.stats().ready == 4  # nothing ran during the hold

    cli(["release", APP, queue_name], env)
    wait_until(lambda: {r.token for r in runs() if r.kind == "work"}
               == {"first", "n0", "n1", "n2"}, timeout_s=20)
    assert q.holds().queue_s == 0
