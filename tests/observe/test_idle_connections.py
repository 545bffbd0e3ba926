"""Idle connections against the console and the metrics server: a process whose file
limit is 256 keeps answering real requests while 300 connections sit open sending
nothing, and says so in a few log lines.

Before: every connection was accepted until the process ran out of descriptors; then
the accept loop logged a "Too many open files" traceback per attempt (tens of MB in
seconds) and nothing was answered until the idle clients let go.

The servers run as the user runs them: ``batchq web`` and ``batchq worker -p 1
--metrics-port`` (the supervisor's metrics process), in subprocesses started with
RLIMIT_NOFILE 256.
"""

from __future__ import annotations

import contextlib
import logging
import resource
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import helpers
import pytest
from helpers import CliProcess, free_port, wait_until

from batchq.ops.connlimit import ConnectionGate, max_connections_from

pytestmark = pytest.mark.fault

FILE_LIMIT = 256
IDLE = 300
ANSWER_WITHIN_S = 5.0
MAX_LOG_LINES = 30


def _low_file_limit() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (FILE_LIMIT, FILE_LIMIT))


def _start_limited(args: list[str], env: dict[str, str]) -> CliProcess:
    """``start_cli`` with the file limit lowered in the child."""
    fd, name = tempfile.mkstemp(prefix="batchq-idle-", suffix=".log")
    with open(fd, "wb") as log:
        proc = CliProcess([sys.executable, "-m", "batchq", *args], cwd=helpers.REPO_ROOT,
                          env=helpers.cli_env(env), stdin=subprocess.DEVNULL, stdout=log,
                          stderr=subprocess.STDOUT, text=True,
                          preexec_fn=_low_file_limit)
    proc.log_path = Path(name)
    helpers._STARTED.append(proc)
    return proc


def _get(port: int, path: str, timeout_s: float) -> int:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=timeout_s) as resp:
        resp.read()
        return int(resp.status)


def _answers(port: int, path: str) -> bool:
    with contextlib.suppress(OSError):
        return _get(port, path, 1.0) == 200
    return False


@contextlib.contextmanager
def _idle_sockets(port: int, n: int) -> Iterator[list[socket.socket]]:
    socks: list[socket.socket] = []
    try:
        for _ in range(n):
            s = socket.create_connection(("127.0.0.1", port), timeout=5)
            socks.append(s)
        yield socks
    finally:
        for s in socks:
            s.close()


def _check_answers_under_idle_flood(proc: CliProcess, port: int, path: str) -> None:
    wait_until(lambda: _answers(port, path) or proc.poll() is not None, 30,
               message=f"{path} did not answer")
    assert proc.poll() is None, proc.read_log()
    with _idle_sockets(port, IDLE):
        time.sleep(1.0)  # the server has taken them all in
        t0 = time.monotonic()
        try:
            code = _get(port, path, ANSWER_WITHIN_S)
        except OSError as exc:
            pytest.fail(f"no answer within {ANSWER_WITHIN_S}s with {IDLE} idle "
                        f"connections open: {exc}\n{proc.read_log()[-3000:]}")
        took_s = time.monotonic() - t0
        assert code == 200
        time.sleep(1.0)  # whatever the flood makes the server log, let it log it
        print(f"\n{path} answered in {took_s * 1000:.0f} ms with {IDLE} idle connections "
              f"open (file limit {FILE_LIMIT})")
    log = proc.read_log()
    lines = log.splitlines()
    assert len(lines) <= MAX_LOG_LINES, f"{len(lines)} log lines:\n" + "\n".join(lines[:40])
    assert "Traceback" not in log, log[-3000:]
    assert proc.poll() is None
    assert _answers(port, path)  # and after the flood


def test_console_answers_with_idle_connections_open(redis_url: str, namespace: str) -> None:
    port = free_port()
    proc = _start_limited(["web", "--redis-url", redis_url, "--namespace", namespace,
                           "--port", str(port)], {})
    try:
        _check_answers_under_idle_flood(proc, port, "/")
    finally:
        proc.stop()


def test_metrics_server_answers_with_idle_connections_open(redis_url: str,
                                                           namespace: str) -> None:
    port = free_port()
    proc = _start_limited(["worker", "apps.basic:app", "-p", "1", "--metrics-port", str(port)],
                          {"BATCHQ_REDIS_URL": redis_url, "BATCHQ_TEST_NS": namespace})
    try:
        _check_answers_under_idle_flood(proc, port, "/healthz")
    finally:
        assert proc.stop(timeout_s=20) == 0, proc.read_log()[-3000:]


def test_worker_with_console_runs_jobs_while_idle_connections_sit_on_it(
        redis_url: str, namespace: str, queue_name: str, tmp_path: Path) -> None:
    from apps.basic import build

    port = free_port()
    log_path = tmp_path / "runs.log"
    proc = _start_limited(["worker", "apps.basic:app", "-q", queue_name, "--web",
                           "--web-port", str(port)],
                          {"BATCHQ_REDIS_URL": redis_url, "BATCHQ_TEST_NS": namespace,
                           "BATCHQ_TEST_LOG": str(log_path)})
    app = build(redis_url, namespace, str(log_path))
    try:
        _check_answers_under_idle_flood(proc, port, "/")
        with _idle_sockets(port, IDLE):
            # the worker shares the file limit with its console: its Redis connections
            # still open, its jobs still run
            app.tasks["noop"].options(queue=queue_name).enqueue_many(
                [(f"j{i}",) for i in range(50)])
            wait_until(lambda: log_path.exists() and
                       len(log_path.read_text().splitlines()) >= 50, 20,
                       message="the worker did not run its jobs")
        assert "Traceback" not in proc.read_log()
    finally:
        app.close()
        assert proc.stop(timeout_s=20) == 0, proc.read_log()[-3000:]


def test_a_connection_without_a_request_is_closed_after_the_header_timeout(
        redis_url: str, namespace: str, monkeypatch: pytest.MonkeyPatch) -> None:
    import batchq
    from batchq.web import server

    monkeypatch.setattr(server, "HEADER_TIMEOUT_S", 0.5)
    app = batchq.App(redis_url, namespace=namespace)
    web = server.start_in_thread(app, "127.0.0.1", 0)
    try:
        for opening in (b"", b"GET / HTTP/1.1\r\nHost: x\r\n"):  # nothing; half a request
            with socket.create_connection(("127.0.0.1", web.port), timeout=10) as s:
                s.sendall(opening)
                assert s.recv(1024) == b""  # closed by the server, long before 10 s
        assert _answers(web.port, "/")  # a real request is answered
    finally:
        web.stop()
        app.close()


# --- the gate itself -------------------------------------------------------------------


def test_gate_closes_the_oldest_idle_connection_and_refuses_when_all_are_busy() -> None:
    closed: list[str] = []
    gate = ConnectionGate("test", 3, logging.getLogger("test"))
    for key in "abc":
        assert gate.opened(key, lambda k=key: closed.append(k))  # type: ignore[misc]
    gate.busy("a")
    assert gate.opened("d", lambda: closed.append("d"))  # b: the oldest idle one
    assert closed == ["b"]
    gate.busy("c")
    gate.busy("d")
    assert not gate.opened("e", lambda: closed.append("e"))  # all busy: refused
    gate.idle("a")  # answered: idle again, and the newest idle
    gate.closed("c")
    assert gate.opened("f", lambda: closed.append("f"))  # room: nothing closed
    assert gate.opened("g", lambda: closed.append("g"))
    assert closed == ["b", "a"]
    assert len(gate) == 3


def test_cap_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    log = logging.getLogger("test")
    monkeypatch.delenv("X_MAX", raising=False)
    assert 8 <= max_connections_from(None, "X_MAX", log) <= 1024
    assert max_connections_from(5, "X_MAX", log) == 5
    for bad in (0, -1, 10**20):
        with pytest.raises(ValueError, match="max_connections"):
            max_connections_from(bad, "X_MAX", log)
    monkeypatch.setenv("X_MAX", "77")
    assert max_connections_from(None, "X_MAX", log) == 77
    monkeypatch.setenv("X_MAX", "lots")  # logged, the default used: never a crash
    assert 8 <= max_connections_from(None, "X_MAX", log) <= 1024
