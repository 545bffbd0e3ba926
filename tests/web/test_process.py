"""``batchq web`` as a real process: the bind rule, flags, exit codes, signals; and
``python -m batchq.web``, the same command.

A console on any address but loopback refuses to start without a token (exit 2, a
message, no traceback), and once started with one answers 401 to every request that
does not carry it. Without the web extra the command says what to install (exit 2) and
every other command still works.
"""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import REPO_ROOT, cli_env, free_port
from workers import worker_env

import batchq
from batchq.dev.server import EmbeddedServer

from .conftest import APP_REF, Reply, http, wait_answer

pytestmark = pytest.mark.e2e

TOKEN = "process-test-token-0123456789"
WEB = ["-m", "batchq", "web"]
"""``batchq web``; ``python -m batchq.web`` is ``ALIAS``."""
ALIAS = ["-m", "batchq.web"]


def run(*args: str, env: dict[str, str | None] | None = None, cmd: list[str] = WEB
        ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *cmd, *args], cwd=REPO_ROOT,
                          env=cli_env(worker_env(env)), capture_output=True, text=True,
                          timeout=30, check=False, stdin=subprocess.DEVNULL)


@pytest.fixture
def start() -> Iterator[object]:
    procs: list[subprocess.Popen[str]] = []

    def go(*args: str, env: dict[str, str | None] | None = None, cmd: list[str] = WEB
           ) -> subprocess.Popen[str]:
        p = subprocess.Popen([sys.executable, *cmd, *args], cwd=REPO_ROOT,
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
    return wait_answer(url, proc, lambda: proc.communicate()[0])


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


@pytest.mark.parametrize("cmd", [WEB, ALIAS], ids=["batchq-web", "python-m-batchq.web"])
def test_serves_on_loopback_with_the_app_and_stops_on_sigterm(
        start: object, redis_url: str, capp: batchq.App, cmd: list[str]) -> None:
    port = free_port()
    proc = start(APP_REF, "--port", str(port), "--read-only",  # type: ignore[operator]
                 env={"BATCHQ_REDIS_URL": redis_url, "BATCHQ_NAMESPACE": capp.namespace},
                 cmd=cmd)
    url = f"http://127.0.0.1:{port}/"
    assert up(proc, url).status == 200
    info = http("GET", url + "api/info").json()
    assert {"default", "side", "bulk"} <= set(info["queues"])  # the app's queues
    page = http("GET", url + "queue?name=side").text
    assert 'content="1"' in page.split("batchq-read-only", 1)[1][:20]
    code, out = stopped(proc)
    assert code == 0, out
    with pytest.raises(OSError):
        http("GET", url)  # nothing listens any more


def test_the_alias_keeps_a_redis_password_out_of_the_process_list(start: object) -> None:
    """``python -m batchq.web --redis-url`` is re-executed like ``batchq web``: the
    password moves from the arguments to the environment, and still reaches Redis."""
    secret = "web-alias-secret-0123"
    with EmbeddedServer(free_port(), extra_args=("--requirepass", secret)) as server:
        port = free_port()
        proc = start("--port", str(port), "--redis-url",  # type: ignore[operator]
                     f"redis://:{secret}@127.0.0.1:{server.port}/0", cmd=ALIAS)
        url = f"http://127.0.0.1:{port}/"
        assert up(proc, url).status == 200
        assert http("GET", url + "api/info").status == 200  # the password reached Redis
        line = Path(f"/proc/{proc.pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        assert "batchq.web" in line and "--redis-url" not in line, line
        assert secret not in line
        code, out = stopped(proc)
    assert code == 0, out
    assert secret not in out


def test_a_port_in_use_exits_1(redis_url: str) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        res = run("--port", str(port), "--redis-url", redis_url)
    assert res.returncode == 1, res
    assert f"cannot listen on 127.0.0.1:{port}" in res.stderr
    no_traceback(res.stderr)


def test_without_the_web_extra_it_says_what_to_install(tmp_path: Path, redis_url: str) -> None:
    """A ``starlette`` that cannot be imported stands for the extra not installed."""
    fake = tmp_path / "starlette"
    fake.mkdir()
    (fake / "__init__.py").write_text("raise ImportError('starlette hidden by the test')\n")
    env = {"PYTHONPATH": str(tmp_path), "BATCHQ_REDIS_URL": redis_url}
    for cmd in (WEB, ["-m", "batchq", "worker", APP_REF, "--web"]):
        res = run(env=env, cmd=cmd)
        assert res.returncode == 2, res
        assert "pip install 'batchq[web]'" in res.stderr, res.stderr
        assert "starlette hidden by the test" in res.stderr
        no_traceback(res.stderr)
    # the other commands do not need it
    res = run("--json", env=env, cmd=["-m", "batchq", "info"])
    assert res.returncode == 0 and '"queues"' in res.stdout, res


@pytest.mark.parametrize(("args", "code", "text"), [
    (["--port", "70000"], 2, "--port: must be a port number 0..65535, got 70000"),
    (["--port", "web"], 2, "--port: expected an integer, got 'web'"),
    (["--refresh", "0"], 2, "--refresh: must be 1 to 60 seconds, got '0'"),
    (["--refresh", "nan"], 2, "--refresh: must be a finite number"),
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
