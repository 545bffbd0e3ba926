"""Tests for batchq.dev.server (the bundled Valkey launcher)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import redis
from helpers import cli_env, free_port, stop_proc, wait_until

from batchq.dev.server import EmbeddedServer, start_embedded

pytestmark = pytest.mark.integration


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still "exists" for kill(0); stop() reaps, so treat it as gone.
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _port_open(port: int) -> bool:
    # Raw socket: redis-py retries refused connections with backoff (slow).
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except OSError:
        return False
    return True


def test_start_ping_stop() -> None:
    server = EmbeddedServer().start()
    try:
        assert server.pid is not None
        assert server.url == f"redis://127.0.0.1:{server.port}/0"
        client = redis.Redis.from_url(server.url)
        assert client.ping() is True
        client.set(b"k", b"v")
        assert client.get(b"k") == b"v"
        assert client.config_get("maxmemory-policy")["maxmemory-policy"] == "noeviction"
        assert client.config_get("save")["save"] == ""
        client.close()
    finally:
        server.stop()
    assert server.pid is None


def test_two_servers_get_different_ports() -> None:
    with EmbeddedServer() as a, EmbeddedServer() as b:
        assert a.port != b.port
        assert a.pid != b.pid
        assert redis.Redis.from_url(a.url).ping()
        assert redis.Redis.from_url(b.url).ping()


def test_stop_ends_process_and_removes_temp_dir() -> None:
    server = start_embedded()
    pid = server.pid
    workdir = Path(server.dir)
    assert pid is not None
    assert workdir.is_dir()
    assert (workdir / "valkey.log").exists()
    assert _pid_alive(pid)

    server.stop()
    assert not _pid_alive(pid)
    assert not workdir.exists()
    assert not _port_open(server.port)
    server.stop()  # idempotent


def test_given_dir_is_kept_and_appendonly(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with EmbeddedServer(dir=str(data), appendonly=True) as server:
        client = redis.Redis.from_url(server.url)
        assert client.config_get("appendonly")["appendonly"] == "yes"
        client.close()
    assert data.is_dir()
    assert (data / "valkey.log").exists()


def test_explicit_port() -> None:
    port = free_port()
    with EmbeddedServer(port) as server:
        assert server.port == port
        assert server.url.endswith(f":{port}/0")
        assert redis.Redis(port=port).ping()


def test_port_in_use_raises_with_log_tail() -> None:
    with socket.socket() as blocker:
        blocker.bind(("127.0.0.1", 0))
        blocker.listen()
        port = blocker.getsockname()[1]
        server = EmbeddedServer(port)
        with pytest.raises(RuntimeError, match=r"(?i)address already in use"):
            server.start(timeout_s=5)
        assert server.pid is None


def test_bad_extra_args_raise_runtime_error() -> None:
    server = EmbeddedServer(extra_args=["--no-such-directive", "1"])
    with pytest.raises(RuntimeError, match="no-such-directive"):
        server.start(timeout_s=5)
    assert server.pid is None
    assert not Path(server.dir).exists()


def test_stop_kills_when_sigterm_is_ignored() -> None:
    # A server that ignores SIGTERM (paused with SIGSTOP) must still be stopped.
    server = start_embedded()
    pid = server.pid
    assert pid is not None
    os.kill(pid, signal.SIGSTOP)
    server.stop(timeout_s=0.5)
    wait_until(lambda: not _pid_alive(pid), timeout_s=5, message="server still alive")


def test_restart_after_stop() -> None:
    server = EmbeddedServer()
    server.start()
    first_dir = server.dir
    server.stop()
    server.start()
    try:
        assert server.dir != first_dir
        assert redis.Redis.from_url(server.url).ping()
    finally:
        server.stop()


def test_auto_port_retries_when_picked_port_is_taken(monkeypatch: pytest.MonkeyPatch) -> None:
    import batchq.dev.server as server_module

    with socket.socket() as blocker:
        blocker.bind(("127.0.0.1", 0))
        blocker.listen()
        busy = blocker.getsockname()[1]
        picks = iter([busy, free_port()])
        monkeypatch.setattr(server_module, "pick_free_port", lambda host: next(picks))
        with EmbeddedServer() as server:
            assert server.port != busy
            assert redis.Redis.from_url(server.url).ping()


def _python(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def test_atexit_guard_stops_forgotten_server() -> None:
    code = (
        "from batchq.dev.server import start_embedded\n"
        "s = start_embedded()\n"
        "print(s.pid, s.dir, flush=True)\n"
    )
    out = subprocess.run(
        _python(code), env=cli_env(), capture_output=True, text=True, timeout=30, check=True
    ).stdout.split()
    pid, workdir = int(out[0]), Path(out[1])
    wait_until(lambda: not _pid_alive(pid), timeout_s=5, message="orphaned valkey-server")
    assert not workdir.exists()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_serve_forever_stops_on_signal(sig: signal.Signals, tmp_path: Path) -> None:
    port = free_port()
    log = tmp_path / "out.log"
    code = f"from batchq.dev.server import serve_forever; raise SystemExit(serve_forever({port}))"
    with open(log, "w") as fh:
        proc = subprocess.Popen(_python(code), env=cli_env(), stdout=fh, stderr=subprocess.STDOUT)
    try:
        wait_until(lambda: "export BATCHQ_REDIS_URL=" in log.read_text(), message="no banner")
        text = log.read_text()
        assert f"export BATCHQ_REDIS_URL=redis://127.0.0.1:{port}/0" in text
        assert redis.Redis(port=port).ping()
        proc.send_signal(sig)
        assert proc.wait(timeout=15) == 0, log.read_text()
    finally:
        stop_proc(proc)
    assert not _port_open(port)
