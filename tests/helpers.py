"""Shared helpers for the batchq test-suite (polling, ports, running the CLI)."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

REPO_ROOT = Path(__file__).resolve().parent.parent
TESTS_DIR = REPO_ROOT / "tests"

T = TypeVar("T")

# Processes started by start_cli(); conftest kills leftovers at session end.
_STARTED: list[CliProcess] = []


def wait_until(
    predicate: Callable[[], T],
    timeout_s: float = 10.0,
    interval_s: float = 0.02,
    message: str = "",
) -> T:
    """Poll ``predicate`` until it returns a truthy value, and return that value.

    Raises AssertionError (with ``message``) if it is still falsy after ``timeout_s``.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        result = predicate()
        if result:
            return result
        if time.monotonic() >= deadline:
            detail = f": {message}" if message else ""
            raise AssertionError(f"condition not met within {timeout_s:.1f}s{detail}")
        time.sleep(interval_s)


def free_port(host: str = "127.0.0.1") -> int:
    """Return a TCP port that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
    return port


def cli_env(env: Mapping[str, str | None] | None = None) -> dict[str, str]:
    """Environment for a CLI subprocess: os.environ + ``env`` (None values unset).

    PYTHONPATH gets the repo root and tests/ prepended; output is unbuffered.
    """
    merged = dict(os.environ)
    merged["PYTHONUNBUFFERED"] = "1"
    for key, value in (env or {}).items():
        if value is None:
            merged.pop(key, None)
        else:
            merged[key] = value
    paths = [str(REPO_ROOT), str(TESTS_DIR)]
    if merged.get("PYTHONPATH"):
        paths.append(merged["PYTHONPATH"])
    merged["PYTHONPATH"] = os.pathsep.join(paths)
    return merged


def run_cli(
    args: Sequence[str],
    env: Mapping[str, str | None] | None = None,
    timeout_s: float = 60,
) -> subprocess.CompletedProcess[str]:
    """Run ``python -m batchq *args`` to completion and capture stdout/stderr (text)."""
    return subprocess.run(
        [sys.executable, "-m", "batchq", *args],
        cwd=REPO_ROOT,
        env=cli_env(env),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )


class CliProcess(subprocess.Popen[str]):
    """A running ``python -m batchq`` process whose stdout+stderr go to a log file."""

    log_path: Path

    def read_log(self) -> str:
        return read_log(self)

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = 10.0) -> int:
        return stop_proc(self, sig=sig, timeout_s=timeout_s)


def start_cli(
    args: Sequence[str],
    env: Mapping[str, str | None] | None = None,
) -> CliProcess:
    """Start ``python -m batchq *args`` without waiting (same process group).

    stdout and stderr are combined into a temporary log file; use
    ``read_log(proc)`` / ``proc.read_log()`` to read it.
    """
    fd, name = tempfile.mkstemp(prefix="batchq-cli-", suffix=".log")
    with os.fdopen(fd, "wb") as log:
        proc = CliProcess(
            [sys.executable, "-m", "batchq", *args],
            cwd=REPO_ROOT,
            env=cli_env(env),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            text=True,
        )
    proc.log_path = Path(name)
    _STARTED.append(proc)
    return proc


def read_log(proc: Any) -> str:
    """Combined stdout/stderr written so far by a process from ``start_cli``."""
    path: Path = proc.log_path
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return ""


def stop_proc(
    proc: subprocess.Popen[Any], sig: int = signal.SIGTERM, timeout_s: float = 10.0
) -> int:
    """Send ``sig`` if running, wait ``timeout_s``, then SIGKILL; return the exit code."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(sig)
        try:
            return proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
    return proc.wait(timeout=10)


def cleanup_started() -> None:
    """Kill any start_cli() process still running and delete the log files."""
    while _STARTED:
        proc = _STARTED.pop()
        if proc.poll() is None:
            with contextlib.suppress(Exception):
                stop_proc(proc, sig=signal.SIGKILL, timeout_s=5)
        with contextlib.suppress(OSError):
            proc.log_path.unlink()


# --- processes --------------------------------------------------------------------------


def proc_stat(pid: int) -> tuple[str, int] | None:
    """(state, ppid) of a process from /proc, None if it is gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = raw[raw.rindex(")") + 2 :].split()
    return fields[0], int(fields[1])


def alive(pid: int) -> bool:
    """The process exists and is not a zombie."""
    st = proc_stat(pid)
    return st is not None and st[0] != "Z"


def children(pid: int) -> set[int]:
    """Live (not zombie) children of ``pid``, found by their ppid in /proc."""
    out: set[int] = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            st = proc_stat(int(entry))
            if st is not None and st[1] == pid and st[0] != "Z":
                out.add(int(entry))
    return out


def app_in_namespace(make: Callable[[str, str], Any], redis_url: str, namespace: str,
                     r: Any) -> Iterator[Any]:
    """The body of an ``app`` fixture: ``make(redis_url, namespace)``, closed and its
    namespace's keys deleted at teardown."""
    a = make(redis_url, namespace)
    yield a
    a.close()
    drop_namespace(r, namespace)


def drop_namespace(r: Any, namespace: str) -> None:
    """Delete every key of a test's namespace (``<namespace>*``), 500 at a time."""
    keys = list(r.scan_iter(match=f"{namespace}*", count=1000))
    for i in range(0, len(keys), 500):
        r.delete(*keys[i : i + 500])


def script_calls(r: Any) -> int:
    """Script calls the server has served: ``FCALL`` (functions) and ``EVALSHA`` (a server
    without them, a cluster), rejected ones included (``INFO commandstats``)."""
    stats = r.info("commandstats")
    return sum(int(stats.get(f"cmdstat_{c}", {}).get("calls", 0))
               + int(stats.get(f"cmdstat_{c}", {}).get("rejected_calls", 0))
               for c in ("evalsha", "fcall"))


def forget_scripts(r: Any) -> None:
    """What a restarted server without persistence knows of batchq's scripts: nothing
    (``SCRIPT FLUSH`` and ``FUNCTION FLUSH``)."""
    r.script_flush()
    r.function_flush()


def function_libraries(r: Any) -> set[str]:
    """The names of the function libraries the server holds (``FUNCTION LIST``)."""
    return {dict(zip(lib[::2], lib[1::2], strict=True))[b"library_name"].decode()
            for lib in r.function_list()}
