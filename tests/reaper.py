"""The test session's reaper: what a session started dies with it, however it ends.

pytest-timeout's "thread" method (pyproject.toml) ends a wedged run with ``os._exit``:
no fixture tears down, so the session's embedded Valkey and any worker a test started
would run on, loading the machine for whatever runs next (CI's Redis 7.0 re-run). At
session start every process the tests start gets a mark in its environment (inherited
by what those start, forked or exec'd); a watchdog outside the session's process group
waits for the pytest process to end (a pidfd), then kills every process still carrying
that session's mark. After a clean run the fixtures have stopped everything already and
it finds nothing. Processes started with an environment built from scratch carry no
mark and are not reaped (the fixtures still stop them on a clean run).

``start()`` runs from the root conftest; ``-p reaper`` loads it into any pytest run.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid

import pytest

MARK = "PYTEST_BATCHQ_SESSION"
"""The environment variable naming the session (not ``BATCHQ_``/``BENCH_``: the bench
harness drops those from its fleets' environments)."""

_WATCHDOG = r"""
import os, select, signal, sys, time
parent, mark = int(sys.argv[1]), sys.argv[2].encode()
try:
    fd = os.pidfd_open(parent)
    select.select([fd], [], [])  # readable once the process has ended
except OSError:  # no pidfd (an old kernel): poll
    while os.path.exists(f"/proc/{parent}"):
        time.sleep(0.5)

def marked():
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as f:
                if mark in f.read().split(b"\0"):
                    found.append(int(name))
        except OSError:
            pass
    return found

for _ in range(5):  # a process may start another while it is being killed
    pids = marked()
    if not pids:
        break
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    time.sleep(0.2)
"""

_watchdog: subprocess.Popen[bytes] | None = None


def start() -> None:
    """Mark this session's children and start its watchdog (once per process)."""
    global _watchdog
    if _watchdog is not None:
        return
    value = uuid.uuid4().hex
    env = {k: v for k, v in os.environ.items() if k != MARK}
    argv = [sys.executable, "-c", _WATCHDOG, str(os.getpid()), f"{MARK}={value}"]
    _watchdog = subprocess.Popen(argv, env=env, start_new_session=True,
                                 stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                 stderr=subprocess.DEVNULL)
    os.environ[MARK] = value


def pytest_configure(config: pytest.Config) -> None:
    start()
