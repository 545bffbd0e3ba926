"""``python -m batchq.dev.demo`` end to end: a real producer, a real burst worker subprocess,
and either the demo's own embedded Valkey or the suite's Redis."""

from __future__ import annotations

import re
import socket
import subprocess
import sys

import pytest
import redis
from helpers import REPO_ROOT, cli_env, free_port

pytestmark = pytest.mark.e2e

JOBS = 2000


def _run_demo(env: dict[str, str | None], *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "batchq.dev.demo", "--jobs", str(JOBS), *extra],
        cwd=REPO_ROOT,
        env=cli_env(env),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=100,
        check=False,
    )


def _assert_ok(proc: subprocess.CompletedProcess[str]) -> str:
    out = proc.stdout
    assert proc.returncode == 0, f"exit {proc.returncode}\n{out}\n{proc.stderr}"
    assert re.search(rf"^drain\s+{JOBS:,} / {JOBS:,} jobs done in [\d.]+ s = [\d,]+ jobs/s",
                     out, re.M), out
    assert re.search(r"^check\s+worker exit 0; ready 0\s+delayed 0\s+reserved 0\s+dead 0: OK$",
                     out, re.M), out
    assert re.search(r"^flow\s+5 customers, each a group of the queue limited to 3,000 "
                     r"emails/s .*: at most 15,000 emails/s in all$", out, re.M), out
    return out


def _first_run(out: str) -> None:
    assert re.search(rf"^enqueue\s+{JOBS:,} jobs in .*dedup key", out, re.M), out
    assert re.search(rf"^summary\s+campaign '[^']+' complete: {JOBS:,} emails, {JOBS:,} sent, "
                     r"0 failed, 0 cancelled", out, re.M), out


def _namespace(out: str) -> str:
    m = re.search(r"in namespace '([^']+)'", out)
    assert m, out
    return m.group(1)


def test_demo_starts_its_own_server_when_no_url_is_set() -> None:
    proc = _run_demo({"BATCHQ_REDIS_URL": None})
    out = _assert_ok(proc)
    _first_run(out)
    m = re.search(r"embedded Valkey at redis://127\.0\.0\.1:(\d+)/0", out)
    assert m, out
    # the embedded server is gone once the demo has exited
    port = int(m.group(1))
    with socket.socket() as sock:
        assert sock.connect_ex(("127.0.0.1", port)) != 0, "embedded server still listening"


def test_demo_uses_the_given_redis_and_leaves_nothing_behind(
        redis_url: str, redis_client: redis.Redis) -> None:
    proc = _run_demo({"BATCHQ_REDIS_URL": redis_url})
    out = _assert_ok(proc)
    _first_run(out)
    assert "embedded" not in out
    ns = _namespace(out)
    assert redis_client.keys(f"{ns}:*") == []


def test_demo_run_twice_with_one_campaign_id_adds_nothing_the_second_time(
        redis_url: str, redis_client: redis.Redis, namespace: str) -> None:
    env: dict[str, str | None] = {"BATCHQ_REDIS_URL": redis_url}
    flags = ("--campaign", "demo-twice", "--namespace", namespace)
    try:
        _first_run(_assert_ok(_run_demo(env, *flags)))
        again = _run_demo(env, *flags)
        out = _assert_ok(again)
        assert re.search(r"^enqueue\s+nothing added: campaign 'demo-twice' is done with "
                         rf"{JOBS:,} jobs", out, re.M), out
        assert "summary" not in out  # on_complete ran once, in the first run
        assert redis_client.hlen(f"{namespace}:{{{namespace}:emails}}:dedup") == JOBS
    finally:
        keys = list(redis_client.scan_iter(match=f"{namespace}:*", count=1000))
        if keys:
            redis_client.delete(*keys)


def test_importing_the_demo_starts_nothing() -> None:
    # the worker subprocess imports batchq.dev.demo:app: that must not start a server,
    # connect anywhere or print anything
    unused = f"redis://127.0.0.1:{free_port()}/0"
    code = ("import batchq.dev.demo as d; "
            f"assert d.app.redis_url == {unused!r}; "
            "assert d.app.namespace == 'nsx'; "
            "assert 'send_email' in d.app.tasks")
    proc = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO_ROOT,
        env=cli_env({"BATCHQ_REDIS_URL": unused, "BATCHQ_DEMO_NAMESPACE": "nsx"}),
        capture_output=True, text=True, timeout=30, check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "" and proc.stderr == ""
