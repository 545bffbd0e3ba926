"""``batchq limit set|list|rm`` and the flow-control part of ``batchq info``, through the
real ``python -m batchq`` against the test server (one namespace per test)."""

from __future__ import annotations

import json
import subprocess

import pytest
from fixtures.flow import *  # noqa: F403
from helpers import run_cli
from workers import worker_env

import batchq
from batchq.flow.limits import Limit

pytestmark = pytest.mark.e2e

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


def test_set_list_rm_round_trip(app: batchq.App, queue_name: str,
                                env: dict[str, str | None]) -> None:
    q = app.queue(queue_name)
    app.tasks["work"].options(queue=queue_name, group="acme").enqueue("a")

    res = cli(["limit", "set", APP, queue_name, "--rate", "100/s", "--burst", "50"], env)
    assert res.stdout.strip() == f"limit of queue {queue_name}: rate 100/s burst 50"
    res = cli(["limit", "set", APP, queue_name, "--group", "acme", "--rate", "600/m",
               "--concurrency", "5", "--max-pending", "1000", "--weight", "2"], env)
    assert "group acme: rate 10/s concurrency 5 max_pending 1000 weight 2" in res.stdout
    cli(["limit", "set", queue_name, "--group", "*", "--concurrency", "3"], env)  # no app
    assert q.limits() == [Limit(None, 100.0, 50), Limit("*", concurrency=3),
                          Limit("acme", 10.0, None, 5, 1000, 2.0)]

    # set replaces, and says what it replaced
    res = cli(["limit", "set", APP, queue_name, "--rate", "200"], env)
    assert "rate 200/s (was: rate 100/s burst 50)" in res.stdout
    assert q.limits()[0] == Limit(None, 200.0)

    table = cli(["limit", "list", APP, queue_name], env).stdout
    lines = table.splitlines()
    assert lines[0].split() == ["QUEUE", "GROUP", "RATE", "BURST", "CONCURRENCY",
                                "MAX_PENDING", "WEIGHT"]
    assert lines[1].split() == [queue_name, "(queue)", "200/s", "-", "-", "-", "-"]
    assert lines[2].split() == [queue_name, "*", "-", "-", "3", "-", "-"]
    assert lines[3].split() == [queue_name, "acme", "10/s", "-", "5", "1000", "2"]
    assert "groups: 1 ready, 0 waiting (1 grouped jobs ready)" in table

    res = cli(["limit", "rm", APP, queue_name, "--group", "acme"], env)
    assert f"removed the limit of queue {queue_name}, group acme" in res.stdout
    res = cli(["limit", "rm", APP, queue_name, "--group", "acme"], env)
    assert "nothing removed" in res.stdout
    cli(["limit", "rm", APP, queue_name, "--group", "*"], env)
    cli(["limit", "rm", APP, queue_name], env)
    assert q.limits() == []
    assert f"no limits on queue {queue_name}" in cli(["limit", "list", APP, queue_name],
                                                     env).stdout


def test_json_shapes(app: batchq.App, queue_name: str, env: dict[str, str | None]) -> None:
    q = app.queue(queue_name)
    work = app.tasks["work"].options(queue=queue_name)
    work.options(group="held").enqueue_many([("h1",), ("h2",)])
    work.options(group="free").enqueue("f1")

    out = json.loads(cli(["limit", "set", APP, queue_name, "--group", "held", "--rate",
                          "5", "--concurrency", "2", "--json"], env).stdout)
    assert out == {"queue": queue_name, "replaced": None,
                   "limit": {"group": "held", "rate_per_s": 5.0, "burst": None,
                             "concurrency": 2, "max_pending": None, "weight": None}}
    q.limit(concurrency=10)
    q.hold(600, group="held")

    out = json.loads(cli(["limit", "list", APP, queue_name, "--json"], env).stdout)
    assert set(out) == {"queue", "limits", "grouped", "groups_ready", "groups_waiting",
                        "held_s", "held_why", "waiting_groups"}
    assert (out["grouped"], out["groups_ready"], out["groups_waiting"]) == (3, 1, 1)
    own, held = out["limits"]
    assert own == {"group": None, "rate_per_s": None, "burst": None, "concurrency": 10,
                   "max_pending": None, "weight": None, "running": 0}
    assert held["group"] == "held" and held["state"] == "waiting"
    assert held["pending"] == 2 and held["running"] == 0
    assert 590 < held["until_s"] <= 600
    [w] = out["waiting_groups"]
    assert w["group"] == "held" and w["state"] == "waiting" and w["pending"] == 2
    assert 590 < w["until_s"] <= 600 and w["why"] == "operator"

    out = json.loads(cli(["limit", "rm", APP, queue_name, "--group", "held", "--json"],
                         env).stdout)
    assert out == {"queue": queue_name, "group": "held", "removed": True}
    out = json.loads(cli(["limit", "rm", APP, queue_name, "--json"], env).stdout)
    assert out == {"queue": queue_name, "group": None, "removed": True}


@pytest.mark.parametrize(("flags", "needle"), [
    (["--rate", "0"], "--rate"),
    (["--rate", "-5"], "--rate"),
    (["--rate", "nan"], "--rate"),
    (["--rate", "inf"], "--rate"),
    (["--rate", "10/week"], "--rate"),
    (["--rate", "2000000"], "--rate"),
    (["--concurrency", "0"], "--concurrency"),
    (["--concurrency", "1.5"], "--concurrency"),
    (["--weight", "nan"], "--weight"),
    (["--group", "g", "--max-pending", "-1"], "--max-pending"),
    (["--burst", "10"], "--burst needs --rate"),
    (["--max-pending", "10"], "--max-pending needs --group"),
    (["--weight", "2"], "--weight needs --group"),
    ([], "give at least one of --rate"),
    (["--group", "", "--rate", "1"], "--group"),
    (["--group", "x" * 65, "--rate", "1"], "--group"),
])
def test_bad_values_exit_2_with_one_line(queue_name: str, env: dict[str, str | None],
                                         flags: list[str], needle: str) -> None:
    res = cli(["limit", "set", queue_name, *flags], env, code=2)
    assert res.stdout == ""
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], res.stderr


def test_bad_usage_of_list_and_rm(queue_name: str, env: dict[str, str | None]) -> None:
    # a flag the action does not take: argparse's own message (after the usage)
    res = cli(["limit", "rm", queue_name, "--rate", "1"], env, code=2)
    assert "unrecognized arguments: --rate 1" in res.stderr
    for args in (["limit", "list", queue_name, "--groups", "0"],
                 ["limit", "frob", queue_name],
                 ["limit", "list", "a:b"]):
        res = cli(args, env, code=2)
        assert len(res.stderr.strip().splitlines()) == 1, res.stderr


def test_info_shows_limits_and_held_groups(app: batchq.App, queue_name: str,
                                           env: dict[str, str | None]) -> None:
    q = app.queue(queue_name)
    work = app.tasks["work"].options(queue=queue_name)
    work.options(group="acme").enqueue_many([("a1",), ("a2",), ("a3",)])
    work.options(group="zeta").enqueue("z1")
    work.enqueue("plain")
    q.limit(rate_per_s=100, burst=100)
    q.limit(group="acme", concurrency=5)
    q.hold(300, group="acme")
    q.hold(60)  # the whole queue

    snap = json.loads(cli(["info", "--json"], env).stdout)
    f = snap["queues"][queue_name]["flow"]
    assert (f["grouped"], f["groups_ready"], f["groups_waiting"]) == (4, 1, 1)
    assert 50 < f["held_s"] <= 60
    assert f["limits_total"] == 2
    assert [x["group"] for x in f["limits"]] == [None, "acme"]
    assert f["limits"][0]["rate_per_s"] == 100.0 and f["limits"][0]["burst"] == 100
    assert f["limits"][1]["state"] == "waiting" and f["limits"][1]["pending"] == 3
    [w] = f["waiting_groups"]
    assert (w["group"], w["state"], w["pending"], w["running"]) == ("acme", "waiting", 3, 0)
    assert 290 < w["until_s"] <= 300
    # a queue without flow control has no flow entry (the shape of info stays as it was)
    app.tasks["work"].options(queue=f"{queue_name}-plain").enqueue("x")
    snap = json.loads(cli(["info", "--json"], env).stdout)
    assert "flow" not in snap["queues"][f"{queue_name}-plain"]

    text = cli(["info"], env).stdout
    assert "flow control:" in text
    assert f"  {queue_name}: 4 grouped jobs ready, groups 1 ready / 1 waiting, queue held" \
        in text
    assert "    limit (queue) rate 100/s burst 100\n" in text
    assert "    limit acme concurrency 5 (running 0) [waiting]\n" in text
    assert "    waiting acme: held 4m" in text and "(pending 3, running 0)" in text


def test_info_lists_at_most_ten_waiting_groups(app: batchq.App, queue_name: str,
                                               env: dict[str, str | None]) -> None:
    q = app.queue(queue_name)
    work = app.tasks["work"].options(queue=queue_name)
    for i in range(15):
        work.options(group=f"g{i:02d}").enqueue(i)
        q.hold(100 + i, group=f"g{i:02d}")
    f = json.loads(cli(["info", "--json"], env).stdout)["queues"][queue_name]["flow"]
    assert f["groups_waiting"] == 15
    # the longest holds first
    assert [w["group"] for w in f["waiting_groups"]] == [f"g{i:02d}" for i in
                                                          range(14, 4, -1)]
    out = json.loads(cli(["limit", "list", queue_name, "--json", "--groups", "3"],
                         env).stdout)
    assert [w["group"] for w in out["waiting_groups"]] == ["g14", "g13", "g12"]
    text = cli(["limit", "list", queue_name, "--groups", "3"], env).stdout
    assert "(3 of 15 waiting groups shown; --groups N for more)" in text


def test_limits_and_groups_written_by_hand_never_crash(app: batchq.App, queue_name: str,
                                                       env: dict[str, str | None]) -> None:
    from batchq.flow import metrics as flow_metrics

    q = app.queue(queue_name)
    k = app.keys(queue_name)
    app.tasks["work"].options(queue=queue_name, group="ok").enqueue("x")
    q.limit(group="ok", concurrency=2)
    app.redis.hset(k.limits, mapping={"~q": "-5,,,,", "zz": "a,b", "6269": "1,1,-3,,"})
    app.redis.hset(k.gstate, "6f6b:run", "lots")
    app.redis.zadd(k.gwait, {"6f6b": 1e18})  # blocked

    res = cli(["limit", "list", queue_name, "--json"], env)
    out = json.loads(res.stdout)
    assert [x["group"] for x in out["limits"]] == ["ok", "zz"]  # "zz": all fields empty
    assert "the limit of (queue) is not a valid limit" in res.stderr
    assert "the limit of 'bi' is not a valid limit" in res.stderr
    assert out["waiting_groups"][0]["state"] == "blocked"
    snap = json.loads(cli(["info", "--json"], env).stdout)
    assert snap["queues"][queue_name]["flow"]["limits_total"] == 4
    cli(["info"], env)
    fams = {f.name: f for f in flow_metrics.limit_families(app.redis, {k.queue: [k]})}
    assert [s.labels["group"] for s in fams["batchq_limit_concurrency_used_ratio"].samples] \
        == ["ok"]

    app.redis.delete(k.gwait, k.limits)
    app.redis.set(k.gwait, "not a zset")
    app.redis.set(k.limits, "not a hash")
    cli(["info", "--json"], env)
    assert list(flow_metrics.limit_families(app.redis, {k.queue: [k]}))
    res = cli(["limit", "list", queue_name], env, code=1)
    assert "WRONGTYPE" in res.stderr
