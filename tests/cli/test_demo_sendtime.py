"""``python -m batchq.dev.demo_sendtime`` end to end on the suite's Redis, with a short
code expiry: a daily quota held, quiet hours kept, a breaker tripping to its fallback
with each message sent once, an expired code never sent."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
from helpers import REPO_ROOT, cli_env

pytestmark = pytest.mark.e2e


def test_sendtime_demo_runs_and_checks_itself(redis_url: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "batchq.dev.demo_sendtime", "--code-ttl-s", "0.5",
         "--timeout-s", "60"],
        cwd=REPO_ROOT, env=cli_env({"BATCHQ_REDIS_URL": redis_url}),
        stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120, check=False)
    out = proc.stdout
    assert proc.returncode == 0, f"exit {proc.returncode}\n{out}\n{proc.stderr}"
    assert re.search(r"^result\s+acme: 5 sent, 3 wait for the next day$", out, re.M), out
    assert re.search(r"^result\s+nightowl: 0 sent, 2 wait for \d\d:00-\d\d:00$", out, re.M), out
    assert re.search(r"^result\s+breaker twilio open after \d+ failures; [1-9]\d* "
                     r"messages re-routed to vonage; every globex message accepted exactly "
                     r"once$", out, re.M), out
    assert re.search(r"^result\s+codes: 1 expired \(never sent\), fresh code sent 1 time",
                     out, re.M), out
    assert re.search(r"^check\s+quota, quiet hours, breaker fallback and expiry: OK$", out,
                     re.M), out


def test_sendtime_demo_refuses_bad_flags() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "batchq.dev.demo_sendtime", "--code-ttl-s", "0"],
        cwd=REPO_ROOT, env=cli_env({}), stdin=subprocess.DEVNULL, capture_output=True,
        text=True, timeout=60, check=False)
    assert proc.returncode == 2 and "--code-ttl-s" in proc.stderr, proc.stderr
