"""Hostile input to the ``batchq`` command, through the real CLI in a
subprocess: flags and ``BATCHQ_*`` values out of range, malformed Redis URLs, a JSON line
nested 100,000 deep, entries written into Redis by hand, and a password on the command
line that must not reach the process list of the supervisor or any child.

Every case ends with a message and an exit code, never a traceback or a loop.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from uuid import uuid4

import msgpack
import pytest
import redis
from fixtures.faults import *  # noqa: F403
from fixtures.faults import FleetFactory
from helpers import free_port, run_cli

import batchq
from batchq.dev.server import EmbeddedServer
from batchq.store import codec
from batchq.store.keys import queues_key
from tests.apps.ops_app import build

pytestmark = pytest.mark.fault

APP = "tests.apps.ops_app:app"
SECRET = "sekret-" + uuid4().hex[:8]


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


def refused(args: list[str], env: dict[str, str | None], named: str) -> str:
    """Run the CLI; it must exit 2 at once with a one-line message naming ``named``."""
    try:
        res = run_cli(args, env=env, timeout_s=20)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"batchq {' '.join(args)} still running after 20 s") from None
    output = res.stdout + res.stderr
    assert res.returncode == 2, f"exit {res.returncode}\n{output}"
    assert "Traceback" not in output, output
    assert named in res.stderr, res.stderr
    return res.stderr


# --- flags and environment values out of range ---------------------------------------------


@pytest.mark.parametrize(("flags", "named"), [
    (["-p", "1", "--max-jobs-per-child", "0"], "--max-jobs-per-child"),
    (["-p", "1", "--max-jobs-per-child", "-5"], "--max-jobs-per-child"),
    (["-p", "1", "--heartbeat-timeout", "-1"], "--heartbeat-timeout"),
    (["-p", "1", "--heartbeat-timeout", "inf"], "--heartbeat-timeout"),
    (["-p", "0"], "-p/--processes"),
    (["-p", "-2"], "-p/--processes"),
    (["--burst", "--lease-s", "nan"], "--lease-s"),
    (["--burst", "--lease-s", "inf"], "--lease-s"),
    (["--burst", "--lease-s", "-3"], "--lease-s"),
    (["--burst", "--shutdown-timeout", "nan"], "--shutdown-timeout"),
    (["--burst", "--shutdown-timeout", "-1"], "--shutdown-timeout"),
    (["--burst", "-c", "0"], "-c/--concurrency"),
    (["--burst", "--fetch-batch", "0"], "--fetch-batch"),
    (["--burst", "--metrics-port", "-1"], "--metrics-port"),
    (["--burst", "--metrics-port", "70000"], "--metrics-port"),
    (["--burst", "-q", "a=0"], "-q/--queues"),
    (["--burst", "-q", "a=x"], "-q/--queues"),
    (["--burst", "-q", "a=1001,b"], "-q/--queues"),
    (["--burst", "-q", "a=,b"], "-q/--queues"),
    (["--burst", "-q", "=3"], "-q/--queues"),
    (["--burst", "-q", "a,b,a"], "-q/--queues"),
    (["--burst", "--order", "sideways"], "--order"),
    (["--burst", "-q", "a=3,b=1", "--order", "strict"], "--order strict"),
])
def test_bad_worker_flag_exits_2_naming_it(flags: list[str], named: str,
                                          env: dict[str, str | None]) -> None:
    refused(["worker", APP, *flags], env, named)


@pytest.mark.parametrize(("var", "value"), [
    ("BATCHQ_MAX_JOBS_PER_CHILD", "0"),
    ("BATCHQ_HEARTBEAT_TIMEOUT", "-1"),
    ("BATCHQ_PROCESSES", "0"),
    ("BATCHQ_LEASE_S", "nan"),
    ("BATCHQ_LEASE_S", "inf"),
    ("BATCHQ_CONCURRENCY", "many"),
    ("BATCHQ_QUEUES", "a=0"),
    ("BATCHQ_ORDER", "sideways"),
])
def test_bad_environment_value_exits_2_naming_it(var: str, value: str,
                                                env: dict[str, str | None]) -> None:
    stderr = refused(["worker", APP, "-p", "1"], {**env, var: value}, var)
    assert repr(value) in stderr or value in stderr


@pytest.mark.parametrize(("args", "value"), [
    (["info", "-i", "nan"], "-i/--interval"),
    (["info", "-i", "0"], "-i/--interval"),
    (["dead", "list", "default", "--limit", "0"], "--limit"),
    (["enqueue", APP, "record", "--from", "x.jsonl", "--chunk", "0"], "--chunk"),
    (["bench", "load", APP, "add", "--rate", "nan", "--duration", "1"], "--rate"),
    (["bench", "load", APP, "add", "--rate", "5", "--duration", "inf"], "--duration"),
])
def test_bad_float_or_count_on_other_commands(args: list[str], value: str,
                                              env: dict[str, str | None]) -> None:
    refused(args, env, value)


BAD_URLS = [
    f"redis://:{SECRET}@127.0.0.1:notaport/0",
    f"redis://:{SECRET}@127.0.0.1:99999/0",
    f"http://:{SECRET}@127.0.0.1:6379/0",
    "redis://127.0.0.1:6379/notadb",
    "redis://127.0.0.1:6379/0?socket_timeout=soon",
]

EVERY_COMMAND = [
    ["worker", APP, "--burst"],
    ["info"],
    ["dead", "list", "default"],
    ["pause", "default"],
    ["resume", "default"],
    ["check"],
    ["enqueue", APP, "record", "--from", "x.jsonl"],
    ["bench", "load", APP, "add", "--rate", "1", "--duration", "1"],
]


@pytest.mark.parametrize("url", BAD_URLS)
def test_malformed_redis_url_on_every_command(url: str, env: dict[str, str | None]) -> None:
    for args in EVERY_COMMAND:
        stderr = refused([*args, "--redis-url", url], env, "--redis-url")
        assert "invalid Redis URL" in stderr and SECRET not in stderr, stderr
    # the same URL from the environment (which the app module reads too)
    for args in (["worker", APP, "--burst"], ["info"], ["dead", "list", "default"]):
        stderr = refused(args, {**env, "BATCHQ_REDIS_URL": url}, "BATCHQ_REDIS_URL")
        assert SECRET not in stderr


# --- poisoned input files and data -------------------------------------------------------------


def test_a_100000_deep_json_line_is_a_bad_line(app: batchq.App, env: dict[str, str | None],
                                               tmp_path: Path) -> None:
    src = tmp_path / "deep.jsonl"
    deep = "[" * 100_000 + "]" * 100_000
    src.write_text("\n".join(['{"args": [1]}', deep, '{"args": [3]}']) + "\n")
    res = run_cli(["enqueue", APP, "record", "--from", str(src)], env=env, timeout_s=60)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "Traceback" not in res.stderr and "RecursionError" not in res.stderr
    assert re.search(r"^2 enqueued, 1 skipped", res.stdout, re.M), res.stdout
    assert f"{src}:2: JSON nested too deeply" in res.stderr, res.stderr
    state = json.loads(Path(str(src) + ".batchq-progress").read_text())
    assert state["finished"] is True and state["next_line"] == 4


def _poisoned_entry(enqueued_ms: object) -> bytes:
    """A job whose header is valid and whose body has an enqueue time of the wrong type."""
    body = msgpack.packb(("add", [1, 2], {}, enqueued_ms))
    return codec.header(0, 3) + codec.new_id().encode() + b":" + body


def test_info_flags_a_malformed_head_and_reports_the_other_queues(
        app: batchq.App, env: dict[str, str | None], namespace: str) -> None:
    app.tasks["add"].enqueue_many([(i, 1) for i in range(3)])
    r = app.redis
    r.rpush(app.keys("poisoned").ready_for(0), _poisoned_entry("yesterday"))
    r.sadd(queues_key(namespace), "poisoned")

    res = run_cli(["info"], env=env, timeout_s=30)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "Traceback" not in res.stdout + res.stderr
    rows = {line.split()[0]: line.split() for line in res.stdout.splitlines() if line.strip()}
    assert rows["default"][1] == "3", res.stdout  # the healthy queue's counts
    assert "poisoned" in rows and "(!)" in rows["poisoned"], res.stdout
    assert re.search(r"\(!\) queue poisoned: .*malformed", res.stdout), res.stdout

    res = run_cli(["info", "--json"], env=env, timeout_s=30)
    assert res.returncode == 0 and "Traceback" not in res.stderr, res.stderr
    snap = json.loads(res.stdout)
    assert snap["queues"]["default"]["ready"] == 3
    bad = snap["queues"]["poisoned"]
    assert "error" in bad or bad.get("malformed_heads"), bad
    assert "poisoned" in res.stderr  # flagged on stderr too, for scripts


def _hand_dead(app: batchq.App, queue: str, jid: bytes, reason: str) -> None:
    """A dead-letter entry written by hand with the id ``jid`` (any bytes)."""
    keys = app.keys(queue)
    raw = codec.header(0, 1) + jid + b":" + codec.encode_body("add", [1], {}, 0)
    rec = codec.encode_dead_record("x", reason, raw, error_type="E", error_message=reason)
    app.redis.zadd(keys.dead, {jid: int(time.time() * 1000)})
    app.redis.hset(keys.dead_jobs, jid, rec)


def test_dead_list_shows_hostile_ids_escaped(app: batchq.App,
                                              env: dict[str, str | None]) -> None:
    _hand_dead(app, "default", b"good-1", "failed")
    _hand_dead(app, "default", b"evil\x1b[2J\x1b]0;pwned\x07", "fail\x1b[31med")
    res = run_cli(["dead", "list", "default"], env=env, timeout_s=30)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "\x1b" not in res.stdout and "\x07" not in res.stdout, repr(res.stdout)
    assert "good-1" in res.stdout
    assert "evil\\x1b[2J\\x1b]0;pwned\\x07" in res.stdout, res.stdout
    res = run_cli(["dead", "show", "default", "--all"], env=env, timeout_s=30)
    assert res.returncode == 0 and "\x1b" not in res.stdout, res.stdout + res.stderr


def test_dead_list_survives_ids_that_are_not_utf8(app: batchq.App,
                                                   env: dict[str, str | None]) -> None:
    _hand_dead(app, "default", b"good-1", "failed")
    _hand_dead(app, "default", b"bad-\xff\xfe", "failed")
    _hand_dead(app, "default", b"good-2", "failed")
    res = run_cli(["dead", "list", "default"], env=env, timeout_s=30)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "good-1" in res.stdout and "good-2" in res.stdout
    assert "bad-\\xff\\xfe" in res.stdout, res.stdout  # its bytes, as a shell writes them
    res = run_cli(["dead", "list", "default", "--json"], env=env, timeout_s=30)
    assert res.returncode == 0, res.stdout + res.stderr
    jobs = json.loads(res.stdout)["jobs"]
    assert len(jobs) == 3
    # JSON keeps the id exact: what comes back names the same bytes in Redis
    bad = next(j["id"] for j in jobs if j["id"].startswith("bad-"))
    assert bad.encode("utf-8", "surrogateescape") == b"bad-\xff\xfe"
    res = run_cli(["dead", "purge", "default", "--id", bad], env=env, timeout_s=30)
    assert res.returncode == 0 and "purged 1 " in res.stdout, res.stdout + res.stderr


# --- a password on the command line -------------------------------------------------------


@pytest.fixture
def password_server() -> Iterator[EmbeddedServer]:
    with EmbeddedServer(free_port(), extra_args=("--requirepass", SECRET)) as server:
        yield server


def _cmdline(pid: int) -> str:
    return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()


def test_a_password_in_redis_url_stays_out_of_the_process_list(
        password_server: EmbeddedServer, fleet_on: FleetFactory) -> None:
    port = password_server.port
    url = f"redis://:{SECRET}@127.0.0.1:{port}/0"
    fleet = fleet_on(url)
    tokens = [f"pw{i}" for i in range(50)]
    fleet.app.tasks["work"].enqueue_many([(t,) for t in tokens])
    # the app module reads BATCHQ_REDIS_URL: give it the URL without the password, so
    # the jobs run only if the flag's value reached every child
    sup = fleet.start("-p", "2", "--redis-url", url,
                      url=f"redis://127.0.0.1:{port}/0")
    kids = fleet.wait_children(sup, 2)
    fleet.wait_completed(tokens)
    for pid in {sup.pid, *kids}:
        line = _cmdline(pid)
        assert "worker" in line, line  # this is the process we think it is
        assert SECRET not in line, f"pid {pid}: {line}"
    # a rolling restart imports the app afresh in new children: still no password
    sup.send_signal(1)
    fresh = fleet.until(lambda: (k := fleet.workers(sup)) and not (k & kids) and len(k) == 2
                        and k, 20, "two new children after SIGHUP")
    for pid in fresh:
        assert SECRET not in _cmdline(pid)
    more = [f"pw-after-hup{i}" for i in range(20)]
    fleet.app.tasks["work"].enqueue_many([(t,) for t in more])
    fleet.wait_completed(more)
    report = fleet.check(tokens + more)
    assert report.valid, report
    r = redis.Redis.from_url(url)
    try:
        assert r.ping()
    finally:
        r.close()
