"""End to end: how the ``batchq`` commands take their arguments, through the
real ``python -m batchq`` against the test server, one namespace per test.

* every command takes ``MODULE:APP`` first; the older ``QUEUE MODULE:APP`` still works,
  and an app that does not import is reported with which argument was taken for what;
* ``dead show QUEUE --limit N`` shows the oldest N;
* ``worker --burst`` names the paused queues that hold jobs before it starts;
* ``enqueue --namespace``, and a rerun of a finished file does nothing unless ``--again``.
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import read_log, run_cli, start_cli, stop_proc, wait_until

import batchq
from tests.apps.ops_app import build

pytestmark = pytest.mark.e2e

APP = "tests.apps.ops_app:app"


@pytest.fixture
def env(redis_url: str, namespace: str) -> dict[str, str | None]:
    return {"BATCHQ_REDIS_URL": redis_url, "BATCHQ_NAMESPACE": namespace,
            "BATCHQ_QUEUES": None, "BATCHQ_PROCESSES": None, "BATCHQ_BURST": None,
            "BATCHQ_LOG_FORMAT": None}


@pytest.fixture
def app(redis_url: str, namespace: str) -> Iterator[batchq.App]:
    a = build(redis_url, namespace)
    yield a
    a.close()


def cli(args: list[str], env: dict[str, str | None], code: int = 0,
        ) -> subprocess.CompletedProcess[str]:
    res = run_cli(args, env=env, timeout_s=30)
    assert res.returncode == code, (
        f"batchq {' '.join(args)}: exit {res.returncode}, expected {code}\n"
        f"stdout:\n{res.stdout}\nstderr:\n{res.stderr}")
    assert "Traceback" not in res.stderr, res.stderr
    return res


def make_dead(app: batchq.App, env: dict[str, str | None], tokens: list[str]) -> None:
    app.tasks["explode"].enqueue_many([(t,) for t in tokens])
    cli(["worker", APP, "-q", "default", "--burst", "-c", "4"], env)
    assert app.queue("default").stats().dead == len(tokens)


def test_the_app_comes_first_in_every_command(app: batchq.App,
                                              env: dict[str, str | None]) -> None:
    make_dead(app, env, ["a", "b"])
    new = json.loads(cli(["dead", "list", APP, "default", "--json"], env).stdout)
    old = json.loads(cli(["dead", "list", "default", APP, "--json"], env).stdout)
    assert new["total"] == old["total"] == 2 and new["jobs"] == old["jobs"]

    assert json.loads(cli(["pause", APP, "side", "--json"], env).stdout)["paused"] is True
    assert json.loads(cli(["resume", "side", APP, "--json"], env).stdout)["paused"] is False
    assert json.loads(cli(["pause", "side", "--json"], env).stdout)["paused"] is True
    assert app.queue("side").is_paused()

    # an app that does not import: the message says how the arguments were read
    res = cli(["dead", "list", "no_such_module:app", "default"], env, code=3)
    assert "cannot import 'no_such_module'" in res.stderr
    assert "took 'no_such_module:app' as MODULE:APP and 'default' as QUEUE" in res.stderr
    res = cli(["dead", "list", "default", "no_such_module:app"], env, code=3)
    assert "took 'no_such_module:app' as MODULE:APP and 'default' as QUEUE" in res.stderr
    res = cli(["enqueue", "no_such_module:app", "record", "--from", "x.jsonl"], env, code=3)
    assert "as MODULE:APP and 'record' as TASK" in res.stderr
    res = cli(["info", "no_such_module:app"], env, code=3)
    assert "taken as MODULE:APP" in res.stderr
    # a queue name cannot hold ':', so two such arguments, or none, are refused clearly
    res = cli(["dead", "list", APP, "other:app"], env, code=2)
    assert "both" in res.stderr
    res = cli(["dead", "list", APP], env, code=2)
    assert "no QUEUE was given" in res.stderr


def test_dead_show_takes_limit(app: batchq.App, env: dict[str, str | None]) -> None:
    make_dead(app, env, ["first", "second", "third"])
    listed = json.loads(cli(["dead", "list", "default", "--json"], env).stdout)["jobs"]
    res = cli(["dead", "show", APP, "default", "--limit", "1", "--json"], env)
    jobs = json.loads(res.stdout)["jobs"]
    assert [j["id"] for j in jobs] == [listed[0]["id"]]  # the oldest, in full
    assert jobs[0]["args"] and "traceback" in jobs[0]
    text = cli(["dead", "show", "default", "--limit", "2"], env).stdout
    assert text.count("\nid:") + text.startswith("id:") == 2, text
    assert listed[2]["id"] not in text
    res = cli(["dead", "show", "default"], env, code=2)
    assert "--id" in res.stderr and "--limit" in res.stderr
    res = cli(["dead", "purge", "default", "--limit", "1"], env, code=2)
    assert "--limit applies to list and show" in res.stderr


def test_burst_on_a_paused_queue_says_so_at_start(app: batchq.App,
                                                  env: dict[str, str | None]) -> None:
    app.tasks["side"].enqueue_many([(i,) for i in range(3)])
    app.queue("side").pause()
    proc = start_cli(["worker", APP, "-q", "side,default", "--burst"], env=env)
    try:
        log = wait_until(lambda: (t := read_log(proc)) and "paused" in t and t, 20,
                         message="a warning about the paused queue")
    finally:
        stop_proc(proc, timeout_s=10)
    assert re.search(r"WARNING.*--burst: paused queue with jobs: side \(3 ready", log), log
    assert app.queue("side").stats().ready == 3


def test_enqueue_namespace_and_a_finished_file_is_not_sent_twice(
        app: batchq.App, env: dict[str, str | None], tmp_path: Path,
        redis_url: str) -> None:
    src = tmp_path / "jobs.jsonl"
    src.write_text("".join(f"[{n}]\n" for n in range(5)))
    other = build(redis_url, app.namespace + "x")
    try:
        res = cli(["enqueue", APP, "record", "--from", str(src), "--namespace",
                   other.namespace], env)
        assert f"namespace {other.namespace}" in res.stdout
        assert other.queue("bulk").stats().ready == 5
        assert app.queue("bulk").stats().ready == 0

        # the same file again: nothing is sent, and the message says why
        res = cli(["enqueue", APP, "record", "--from", str(src), "--namespace",
                   other.namespace], env)
        assert "already enqueued completely" in res.stderr and "--again" in res.stderr
        assert other.queue("bulk").stats().ready == 5

        # into another namespace, the progress file is not taken for this one's
        res = cli(["enqueue", APP, "record", "--from", str(src)], env, code=1)
        assert f"belongs to namespace {other.namespace!r}" in res.stderr
        assert app.queue("bulk").stats().ready == 0

        res = cli(["enqueue", APP, "record", "--from", str(src), "--again"], env)
        assert re.search(r"^5 enqueued", res.stdout, re.M)
        assert app.queue("bulk").stats().ready == 5

        # lines appended to a finished file are still refused without --again: a file
        # is enqueued once, as a whole
        with src.open("a") as f:
            f.write("[5]\n")
        res = cli(["enqueue", APP, "record", "--from", str(src)], env)
        assert "already enqueued completely" in res.stderr
        assert app.queue("bulk").stats().ready == 5
    finally:
        other.close()
