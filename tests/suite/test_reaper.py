"""The session reaper (tests/reaper.py): a pytest run that ends with ``os._exit``, as
pytest-timeout's "thread" method ends a wedged one, leaves nothing it started running."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import alive

pytestmark = pytest.mark.unit

TESTS = Path(__file__).resolve().parent.parent

INNER = '''
import os, subprocess, sys

def test_starts_processes_then_the_run_ends_at_once():
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    # a grandchild through a shell, and a process started with a scrubbed environment
    shell = subprocess.Popen(["sh", "-c", "sleep 300 & echo $!; wait"],
                             stdout=subprocess.PIPE, text=True)
    grandchild = int(shell.stdout.readline())
    bare = subprocess.Popen(["sleep", "300"], env={"PATH": os.environ["PATH"]})
    with open(os.environ["PIDS"], "w") as f:
        f.write(f"{sleeper.pid} {shell.pid} {grandchild} {bare.pid}")
    os._exit(1)  # what pytest-timeout's thread method does: no teardown runs
'''


def test_what_a_killed_session_started_is_reaped(tmp_path: Path) -> None:
    (tmp_path / "test_inner.py").write_text(INNER)
    pids_file = tmp_path / "pids"
    env = {**os.environ, "PIDS": str(pids_file),
           "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}
    inner = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "reaper",
                            "-p", "no:cacheprovider", "--rootdir", str(tmp_path),
                            "-c", os.devnull, str(tmp_path / "test_inner.py")],
                           env=env, capture_output=True, text=True, timeout=60)
    assert inner.returncode == 1, inner.stdout + inner.stderr
    sleeper, shell, grandchild, bare = map(int, pids_file.read_text().split())
    try:
        deadline = time.monotonic() + 15
        while any(alive(p) for p in (sleeper, shell, grandchild)):
            assert time.monotonic() < deadline, "the session's processes outlived it"
            time.sleep(0.1)
        # no mark, no reaping: the reaper kills only what carries its session's mark
        assert alive(bare)
    finally:
        for pid in (sleeper, shell, grandchild, bare):
            if alive(pid):
                os.kill(pid, 9)


def test_the_mark_is_in_this_sessions_children_and_not_in_its_watchdog() -> None:
    import reaper

    value = os.environ.get(reaper.MARK)
    assert value
    out = subprocess.run([sys.executable, "-c", f"import os; print(os.environ['{reaper.MARK}'])"],
                         capture_output=True, text=True, check=True).stdout.strip()
    assert out == value
    watchdog = reaper._watchdog
    assert watchdog is not None and watchdog.poll() is None
    environ = Path(f"/proc/{watchdog.pid}/environ").read_bytes().split(b"\0")
    assert not any(x.startswith(reaper.MARK.encode() + b"=") for x in environ)
    assert any(x.startswith(b"PATH=") for x in environ)
