"""End to end: the operator commands (info, dead, enqueue, pause/resume, check) through
the real ``python -m batchq`` against the test server, one namespace per test."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import pytest
from helpers import run_cli, start_cli, wait_until

import batchq
from batchq.store import codec
from batchq.store.keys import worker_info_key, workers_key
from tests.apps.ops_app import build

pytestmark = pytest.mark.e2e

APP = "tests.apps.ops_app:app"
UNREACHABLE = "redis://127.0.0.1:1/0"
SECRET_URL = "redis://:sekret@127.0.0.1:1/0"


@pytest.fixture
def env(redis_url: str, namespace: str) -> dict[str, str | None]:
    """The CLI's environment: this test's server and namespace, no stray worker settings."""
    return {
        "BATCHQ_REDIS_URL": redis_url,
        "BATCHQ_NAMESPACE": namespace,
        "BATCHQ_QUEUES": None,
        "BATCHQ_PROCESSES": None,
        "BATCHQ_BURST": None,
        "BATCHQ_LOG_FORMAT": None,
    }


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
    return res


def make_dead(app: batchq.App, env: dict[str, str | None], tokens: list[str]) -> None:
    """Dead-letter one ``explode`` job per token (max_attempts=1) with a burst worker."""
    app.tasks["explode"].enqueue_many([(t,) for t in tokens])
    cli(["worker", APP, "-q", "default", "--burst", "-c", "4"], env)
    assert app.queue("default").stats().dead == len(tokens)


def ready_args(app: batchq.App, queue: str) -> list[list[object]]:
    """The args of the jobs waiting in ``queue`` (priority 0), in order."""
    raw = app.redis.lrange(app.keys(queue).ready_for(0), 0, -1)
    return [list(codec.decode_entry(e, queue).args) for e in raw]


# --- info --------------------------------------------------------------------------------


def test_info_json_counts_and_live_workers(app: batchq.App, env: dict[str, str | None],
                                           redis_url: str, namespace: str) -> None:
    make_dead(app, env, ["a", "b", "c"])
    add = app.tasks["add"]
    add.enqueue_many([(i, 1) for i in range(5)])
    add.options(delay_s=60).enqueue_many([(i,) for i in range(4)])

    # a worker that stopped heart-beating two minutes ago must be pruned, not listed
    r = app.redis
    now_ms = int(time.time() * 1000)
    r.zadd(workers_key(namespace), {"ghost:1": now_ms - 120_000})
    r.hset(worker_info_key(namespace, "ghost:1"), mapping={"id": "ghost:1", "pid": 1})

    side = start_cli(["worker", APP, "-q", "side", "-c", "4"], env=env)
    try:
        wait_until(lambda: r.zscore(workers_key(namespace), f"{_host()}:{side.pid}"),
                   timeout_s=15, message="the side worker registers")

        out = json.loads(cli(["info", APP, "--json"], env).stdout)  # exactly one object
        assert set(out) == {"queues", "workers", "periodic"}
        assert out["periodic"] == []  # ops_app has no periodic task
        qs = out["queues"]
        assert list(qs) == sorted(qs)
        d = qs["default"]
        assert set(d) == {"ready", "delayed", "reserved", "dead", "paused", "oldest_age_s"}
        assert (d["ready"], d["delayed"], d["reserved"], d["dead"], d["paused"]) == \
            (5, 4, 0, 3, False)
        assert 0 <= d["oldest_age_s"] < 30
        assert qs["side"] == {"ready": 0, "delayed": 0, "reserved": 0, "dead": 0,
                              "paused": False, "oldest_age_s": 0.0}
        assert qs["bulk"]["ready"] == 0  # an app queue never used yet is listed too

        [w] = out["workers"]
        assert w["id"] == f"{_host()}:{side.pid}"
        assert w["pid"] == side.pid
        assert w["queues"] == "side"
        assert w["concurrency"] == 4
        assert w["paused"] is False
        assert isinstance(w["heartbeat_at"], float)
        assert abs(w["heartbeat_at"] - time.time()) < 30
        assert isinstance(w["succeeded"], int)
        assert r.zscore(workers_key(namespace), "ghost:1") is None

        # no app: --redis-url and --namespace reach the same queues (registered ones only)
        bare = json.loads(cli(["info", "--redis-url", redis_url, "--namespace", namespace,
                               "--json"], {**env, "BATCHQ_NAMESPACE": None}).stdout)
        assert sorted(bare["queues"]) == ["default", "side"]
        bd = dict(bare["queues"]["default"])
        bd.pop("oldest_age_s")
        assert bd == {k: v for k, v in d.items() if k != "oldest_age_s"}
        assert [x["id"] for x in bare["workers"]] == [w["id"]]

        table = cli(["info", APP], env).stdout
        assert re.search(r"^default\s+5\s+4\s+0\s+3\s+no\s", table, re.M), table
        assert w["id"] in table
        assert "workers: 1 live" in table
    finally:
        assert side.stop() == 0, side.read_log()
    out = json.loads(cli(["info", APP, "--json"], env).stdout)
    assert out["workers"] == []  # removed on a clean exit


def _host() -> str:
    return os.uname().nodename


def test_info_interval_refreshes_until_ctrl_c(env: dict[str, str | None]) -> None:
    proc = start_cli(["info", APP, "-i", "0.2"], env=env)
    try:
        wait_until(lambda: proc.read_log().count("\x1b[2J") >= 2, timeout_s=10,
                   message="two refreshes")
        assert "QUEUE" in proc.read_log()
    finally:
        code = proc.stop(sig=signal.SIGINT)
    assert code == 0, proc.read_log()
    assert "Traceback" not in proc.read_log()
    cli(["info", APP, "-i", "0"], env, code=2)


# --- dead --------------------------------------------------------------------------------


def test_dead_list_show_retry_purge(app: batchq.App, env: dict[str, str | None],
                                    redis_url: str, namespace: str) -> None:
    make_dead(app, env, ["a", "b", "c"])
    q = app.queue("default")

    listing = json.loads(cli(["dead", "list", "default", APP, "--json"], env).stdout)
    assert listing["total"] == 3
    jobs = listing["jobs"]
    assert [j["task"] for j in jobs] == ["explode"] * 3
    assert sorted(j["error_message"] for j in jobs) == ["boom a", "boom b", "boom c"]
    for j in jobs:
        assert j["error_type"] == "ValueError"
        assert j["attempts"] == 1
        assert j["reason"]
        assert abs(datetime.fromisoformat(j["died_at"]).timestamp() - time.time()) < 120
    ids = {j["error_message"][-1]: j["id"] for j in jobs}

    limited = json.loads(cli(["dead", "list", "default", APP, "--json", "--limit", "2"],
                             env).stdout)
    assert (limited["total"], len(limited["jobs"])) == (3, 2)

    # no app: --redis-url + --namespace; text output has one row per job
    text = cli(["dead", "list", "default", "--redis-url", redis_url, "--namespace", namespace],
               {**env, "BATCHQ_NAMESPACE": None}).stdout
    for token, jid in ids.items():
        assert re.search(rf"^{re.escape(jid)}\s+explode\s+\S+\s+ValueError: boom {token}\s+1\s",
                         text, re.M), text

    shown = cli(["dead", "show", "default", APP, "--id", ids["a"]], env).stdout
    assert ids["a"] in shown and ids["b"] not in shown
    assert 'args:       ["a"]' in shown
    assert "kwargs:     {}" in shown
    assert "Traceback (most recent call last)" in shown
    assert "ValueError: boom a" in shown
    full = json.loads(cli(["dead", "show", "default", APP, "--id", ids["b"], "--json"],
                          env).stdout)
    [jb] = full["jobs"]
    assert (jb["id"], jb["args"], jb["kwargs"]) == (ids["b"], ["b"], {})
    assert "boom b" in jb["traceback"]
    missing = cli(["dead", "show", "default", APP, "--id", "nosuchid"], env, code=1)
    assert "nosuchid" in missing.stderr

    # retry and purge need --id or --all
    for action in ("retry", "purge"):
        res = cli(["dead", action, "default", APP], env, code=2)
        assert "--id" in res.stderr and "--all" in res.stderr
        cli(["dead", action, "default", APP, "--all", "--id", ids["a"]], env, code=2)
    assert q.stats().dead == 3

    res = cli(["dead", "retry", "default", APP, "--id", ids["a"]], env)
    assert "retried 1 " in res.stdout
    st = q.stats()
    assert (st.ready, st.dead) == (1, 2)
    assert ready_args(app, "default") == [["a"]]

    res = cli(["dead", "purge", "default", APP, "--id", ids["b"]], env)
    assert "purged 1 " in res.stdout
    assert q.stats().dead == 1
    res = cli(["dead", "purge", "default", APP, "--all", "--json"], env)
    assert json.loads(res.stdout) == {"queue": "default", "purged": 1}
    assert q.stats().dead == 0
    assert "retried 0 " in cli(["dead", "retry", "default", APP, "--all"], env).stdout
    assert "no dead jobs" in cli(["dead", "list", "default", APP], env).stdout


# --- enqueue -----------------------------------------------------------------------------


def _write(path: Path, lines: list[str]) -> None:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")


def test_enqueue_from_file_skips_bad_lines(app: batchq.App, env: dict[str, str | None],
                                           tmp_path: Path) -> None:
    src = tmp_path / "jobs.jsonl"
    _write(src, [
        '{"args": [1]}',                              # 1
        '[2, "two"]',                                 # 2 an array is the args
        "{not json",                                  # 3 bad: invalid JSON
        '{"kwargs": {"n": 4, "tag": "four"}}',        # 4
        '{"args": [5], "extra": 1}',                  # 5 bad: wrong shape
        '"just a string"',                            # 6 bad: wrong shape
        '{"args": [7, "x", "too many"]}',             # 7 bad: the task takes 2 arguments
        '{"args": [99999999999999999999999]}',        # 8 bad: msgpack cannot encode it
        '{"args": [9], "kwargs": {"tag": "nine"}}',   # 9
        '{"args": "10"}',                             # 10 bad: args not an array
    ])
    res = cli(["enqueue", APP, "record", "--from", str(src), "--chunk", "2"], env)
    m = re.search(r"^(\d+) enqueued, (\d+) skipped", res.stdout, re.M)
    assert m and (int(m[1]), int(m[2])) == (4, 6), res.stdout
    assert "rate" in res.stdout or "jobs/s" in res.stdout
    for n in (3, 5, 6, 7, 8, 10):
        assert f"{src}:{n}:" in res.stderr, res.stderr
    for n in (1, 2, 4, 9):
        assert f"{src}:{n}:" not in res.stderr
    assert "ETA" not in res.stderr  # stderr is not a terminal: no progress line
    jobs = [codec.decode_entry(e, "bulk")
            for e in app.redis.lrange(app.keys("bulk").ready_for(0), 0, -1)]
    assert [(list(j.args), dict(j.kwargs)) for j in jobs] == [
        ([1], {}), ([2, "two"], {}), ([], {"n": 4, "tag": "four"}), ([9], {"tag": "nine"})]
    assert {j.task for j in jobs} == {"record"}
    assert json.loads(Path(str(src) + ".batchq-progress").read_text())["finished"] is True

    # --progress forces the progress line on a non-terminal (--again: the file finished)
    res = cli(["enqueue", APP, "record", "--from", str(src), "--progress", "--again"], env)
    assert "ETA" in res.stderr and "enqueued" in res.stderr
    assert app.queue("bulk").stats().ready == 8

    # an unknown task is a usage error that lists the tasks; so is a missing --from
    res = cli(["enqueue", APP, "nope", "--from", str(src)], env, code=2)
    assert "nope" in res.stderr and "record" in res.stderr and "add" in res.stderr
    cli(["enqueue", APP, "record"], env, code=2)
    cli(["enqueue", APP, "record", "--from", str(tmp_path / "missing.jsonl")], env, code=1)


def test_enqueue_abort_then_resume(app: batchq.App, env: dict[str, str | None],
                                   tmp_path: Path) -> None:
    src = tmp_path / "big.jsonl"
    state = Path(str(src) + ".batchq-progress")
    lines = [json.dumps({"args": [n]}) for n in range(1, 11)]
    _write(src, [*lines[:5], "{oops", *lines[6:]])  # line 6 is bad

    res = cli(["enqueue", APP, "record", "--from", str(src), "--chunk", "2",
               "--on-error", "abort"], env, code=1)
    assert f"{src}:6:" in res.stderr
    assert ready_args(app, "bulk") == [[1], [2], [3], [4], [5]]
    assert json.loads(state.read_text())["next_line"] == 6

    _write(src, lines)  # fix line 6, then run again: it resumes where it stopped
    res = cli(["enqueue", APP, "record", "--from", str(src), "--chunk", "2",
               "--on-error", "abort"], env)
    assert "resuming from line 6" in res.stderr
    assert re.search(r"^5 enqueued, 0 skipped", res.stdout, re.M), res.stdout
    assert ready_args(app, "bulk") == [[n] for n in range(1, 11)]
    assert json.loads(state.read_text())["finished"] is True

    # --start-line picks the first line explicitly
    res = cli(["enqueue", APP, "record", "--from", str(src), "--start-line", "9"], env)
    assert re.search(r"^2 enqueued, 0 skipped", res.stdout, re.M), res.stdout
    assert ready_args(app, "bulk")[-2:] == [[9], [10]]
    assert app.queue("bulk").stats().ready == 12



def test_enqueue_stopped_by_sigterm_resumes_without_gaps_or_doubles(
        app: batchq.App, env: dict[str, str | None], tmp_path: Path) -> None:
    src = tmp_path / "many.jsonl"
    state = Path(str(src) + ".batchq-progress")
    total = 30_000
    _write(src, [f"[{n}]" for n in range(total)])
    proc = start_cli(["enqueue", APP, "record", "--from", str(src), "--chunk", "10"], env=env)
    try:
        wait_until(state.exists, timeout_s=15, interval_s=0.005, message="first chunk")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=15) == 1, proc.read_log()
    finally:
        proc.stop()
    assert "stopped by SIGTERM" in proc.read_log()
    next_line = json.loads(state.read_text())["next_line"]
    assert app.queue("bulk").stats().ready == next_line - 1 < total

    res = cli(["enqueue", APP, "record", "--from", str(src), "--chunk", "5000"], env)
    assert f"resuming from line {next_line}" in res.stderr
    assert app.queue("bulk").stats().ready == total
    args = ready_args(app, "bulk")
    assert args[0] == [0] and args[-1] == [total - 1]
    assert [a[0] for a in args] == list(range(total))  # in order, none twice
    assert json.loads(state.read_text())["finished"] is True

# --- pause / resume ----------------------------------------------------------------------


def test_pause_stops_a_worker_and_resume_lets_it_drain(
        app: batchq.App, env: dict[str, str | None], redis_url: str, namespace: str) -> None:
    app.tasks["add"].enqueue_many([(i, i) for i in range(5)])
    q = app.queue("default")
    res = cli(["pause", "default", "--redis-url", redis_url, "--namespace", namespace],
              {**env, "BATCHQ_NAMESPACE": None})
    assert "paused" in res.stdout
    assert q.is_paused()

    # not --burst: a burst run on a paused queue exits EXIT_STALLED
    worker = start_cli(["worker", APP, "-q", "default"], env=env)
    try:
        deadline = time.monotonic() + 1.2
        while time.monotonic() < deadline:
            st = q.stats()
            assert (st.ready, st.reserved) == (5, 0)
            assert worker.poll() is None, worker.read_log()
            time.sleep(0.1)
        res = cli(["resume", "default", APP, "--json"], env)
        assert json.loads(res.stdout)["paused"] is False
        wait_until(lambda: q.stats().pending == 0, 15)
        assert worker.poll() is None, worker.read_log()
    finally:
        worker.stop()
    st = q.stats()
    assert (st.ready, st.reserved, st.dead, st.paused) == (0, 0, 0, False)


# --- check and secrets -------------------------------------------------------------------


def test_check(env: dict[str, str | None], redis_url: str) -> None:
    for args in (["check", "--redis-url", redis_url], ["check", APP]):
        res = run_cli(args, env=env, timeout_s=30)
        if res.returncode == 0:
            assert "noeviction" in res.stdout
        else:  # an external Redis with another policy
            assert res.returncode == 1, res.stderr
            assert "maxmemory-policy" in res.stderr
    res = cli(["check", "--redis-url", UNREACHABLE], env, code=1)
    assert "cannot reach Redis at redis://127.0.0.1:1/0" in res.stderr


def test_password_is_never_printed(env: dict[str, str | None], tmp_path: Path) -> None:
    src = tmp_path / "jobs.jsonl"
    _write(src, ['{"args": [1]}'])
    runs: list[tuple[list[str], int, dict[str, str | None]]] = [
        (["check", "--redis-url", SECRET_URL], 1, env),
        (["info", "--redis-url", SECRET_URL], 4, env),
        (["info", "--redis-url", SECRET_URL, "--json"], 4, env),
        (["info", APP], 4, {**env, "BATCHQ_REDIS_URL": SECRET_URL}),
        (["dead", "list", "default", "--redis-url", SECRET_URL], 4, env),
        (["dead", "retry", "default", "--all", "--redis-url", SECRET_URL], 4, env),
        (["pause", "default", "--redis-url", SECRET_URL], 4, env),
        (["enqueue", APP, "record", "--from", str(src), "--redis-url", SECRET_URL], 4, env),
    ]
    for args, code, e in runs:
        res = cli(args, e, code=code)
        assert "sekret" not in res.stdout + res.stderr, (args, res.stdout, res.stderr)
        assert "redis://:***@127.0.0.1:1/0" in res.stderr, (args, res.stderr)


def test_app_that_cannot_be_imported(env: dict[str, str | None]) -> None:
    res = cli(["info", "no_such_module_xyz:app"], env, code=3)
    assert "no_such_module_xyz" in res.stderr
    cli(["dead", "list", "default", "tests.apps.ops_app:nope"], env, code=3)
    cli(["enqueue", "no_such_module_xyz:app", "t", "--from", "x.jsonl"], env, code=3)

