"""``python -m batchq.web`` as a real process: the bind rule, flags, exit codes, signals.

A console on any address but loopback refuses to start without a token (exit 2, a
message, no traceback), and once started with one answers 401 to every request that
does not carry it.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Iterator

import pytest
from helpers import REPO_ROOT, cli_env, free_port, wait_until
from workers import worker_env

import batchq

from .conftest import APP_REF, Reply, http

TOKEN = "process-test-token-0123456789"


def run(*args: str, env: dict[str, str | None] | None = None
        ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "batchq.web", *args], cwd=REPO_ROOT,
                          env=cli_env(worker_env(env)), capture_output=True, text=True,
                          timeout=30, check=False, stdin=subprocess.DEVNULL)


@pytest.fixture
def start() -> Iterator[object]:
    procs: list[subprocess.Popen[str]] = []

    def go(*args: str, env: dict[str, str | None] | None = None) -> subprocess.Popen[str]:
        p = subprocess.Popen([sys.executable, "-m", "batchq.web", *args], cwd=REPO_ROOT,
                             env=cli_env(worker_env(env)), stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True, stdin=subprocess.DEVNULL)
        procs.append(p)
        return p

    yield go
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait(10)


def up(proc: subprocess.Popen[str], url: str) -> Reply:
    def answer() -> Reply | None:
        assert proc.poll() is None, proc.communicate()[0]
        try:
            return http("GET", url)
        except OSError:
            return None
    return wait_until(answer, timeout_s=20, interval_s=0.1, message=f"{url} answers")


def stopped(proc: subprocess.Popen[str]) -> tuple[int, str]:
    proc.send_signal(signal.SIGTERM)
    out = proc.communicate(timeout=15)[0]
    return proc.returncode, out


def no_traceback(out: str) -> None:
    assert "Traceback" not in out, out


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.0.2.1", "example.com"])
def test_refuses_a_non_loopback_bind_without_a_token(host: str, redis_url: str) -> None:
    res = run("--host", host, "--port", "0", "--redis-url", redis_url)
    assert res.returncode == 2, res
    assert "without a token" in res.stderr and "BATCHQ_WEB_TOKEN" in res.stderr
    no_traceback(res.stderr)


def test_refuses_a_short_token(redis_url: str) -> None:
    res = run("--port", "0", "--redis-url", redis_url, env={"BATCHQ_WEB_TOKEN": "tiny-secret"})
    assert res.returncode == 2 and "too short (11 characters" in res.stderr
    assert "tiny-secret" not in res.stderr
    no_traceback(res.stderr)


def test_a_token_is_required_on_a_non_loopback_bind(start: object, redis_url: str,
                                                    capp: batchq.App) -> None:
    port = free_port()
    proc = start("--host", "0.0.0.0", "--port", str(port),  # type: ignore[operator]
                 "--redis-url", redis_url, "--namespace", capp.namespace,
                 env={"BATCHQ_WEB_TOKEN": TOKEN})
    url = f"http://127.0.0.1:{port}/"
    assert up(proc, url).status == 401
    for path in ("api/info", "api/overview", "api/workers", "api/dead?queue=default"):
        assert http("GET", url + path).status == 401, path
    assert http("POST", url + "api/queue/pause", {"queue": "side"}).status == 401
    ok = http("GET", url + "api/info", headers={"Authorization": f"Bearer {TOKEN}"})
    assert ok.status == 200 and "queues" in ok.json()
    code, out = stopped(proc)
    assert code == 0, out
    assert TOKEN not in out


def test_serves_on_loopback_with_the_app_and_stops_on_sigterm(
        start: object, redis_url: str, capp: batchq.App) -> None:
    port = free_port()
    proc = start(APP_REF, "--port", str(port), "--read-only",  # type: ignore[operator]
                 env={"BATCHQ_REDIS_URL": redis_url, "BATCHQ_NAMESPACE": capp.namespace})
    url = f"http://127.0.0.1:{port}/"
    assert up(proc, url).status == 200
    info = http("GET", url + "api/info").json()
    assert {"default", "side", "bulk"} <= set(info["queues"])  # the app's queues
    page = http("GET", url + "queue?name=side").text
    assert 'content="1"' in page.split("batchq-read-only", 1)[1][:20]
    code, out = stopped(proc)
    assert code == 0, out


@pytest.mark.parametrize(("args", "code", "text"), [
    (["--port", "70000"], 2, "port out of range"),
    (["--port", "web"], 2, "not a port number"),
    (["--refresh", "0"], 2, "refresh must be"),
    (["no_such_module_xyz:app"], 3, "cannot import 'no_such_module_xyz'"),
    (["redis://:pw@localhost/0"], 2, "looks like a URL"),
    (["--redis-url", "redis://:hunter2-pw@127.0.0.1:1/0"], 4, "cannot reach Redis"),
])
def test_bad_flags_exit_with_a_message(args: list[str], code: int, text: str) -> None:
    res = run(*args)
    assert res.returncode == code, res
    assert text in res.stderr
    assert "hunter2" not in res.stderr and ":pw@" not in res.stderr
    no_traceback(res.stderr)
