"""``batchq bench``: the load command against a real worker, and the delegation to the
harness. The subcommands are added to a bare parser here (``cli_bench.add_commands``)."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from batchq.cli import bench as cli_bench

pytestmark = pytest.mark.e2e

APP_SOURCE = """
import os

import batchq

app = batchq.App(os.environ["BATCHQ_REDIS_URL"], namespace=os.environ["LOADTEST_NS"])


@app.task(queue="lt")
async def ping(n: int, label: str = "") -> None:
    pass
"""


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="batchq")
    cli_bench.add_commands(p.add_subparsers(dest="command", required=True))
    return p


@pytest.fixture
def user_app(tmp_path: Path, redis_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A user's app module and one worker process serving it; yields ``MODULE:APP``."""
    module = f"loadtest_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{module}.py").write_text(APP_SOURCE)
    ns = f"lt{uuid.uuid4().hex[:8]}"
    monkeypatch.setenv("BATCHQ_REDIS_URL", redis_url)
    monkeypatch.setenv("LOADTEST_NS", ns)
    monkeypatch.syspath_prepend(str(tmp_path))
    env = {k: v for k, v in os.environ.items() if not k.startswith("BATCHQ_")}
    env.update(BATCHQ_REDIS_URL=redis_url, LOADTEST_NS=ns)
    worker = subprocess.Popen(
        [sys.executable, "-m", "batchq", "worker", f"{module}:app", "-c", "10",
         "--no-metrics", "--log-level", "WARNING"],
        cwd=tmp_path, env=env, stdin=subprocess.DEVNULL)
    try:
        yield f"{module}:app"
    finally:
        worker.terminate()
        worker.wait(timeout=30)


def test_load_reports_the_fleets_figures(user_app: str, redis_url: str,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    args = _parser().parse_args(
        ["bench", "load", "--rate", "100", "--duration", "1", user_app, "ping",
         "--args", '{"args": [1], "kwargs": {"label": "x"}}', "--redis-url", redis_url,
         "--settle", "20", "--json"])
    assert args.handler(args) == 0
    captured = capsys.readouterr()
    report = json.loads(captured.out)
    assert report["sent"] == 100 and report["errors"] == 0
    assert sum(row["done"] for row in report["timeline"]) == 100
    assert report["offered_rate"] == 100 and report["achieved_rate"] > 0
    for key in ("run_ms", "start_ms", "done_ms"):
        h = report[key]
        assert h["p50"] <= h["p90"] <= h["p99"] <= h["p999"] <= h["max"]
    assert "sent " in captured.err  # the progress lines


def test_load_table_and_bad_input(user_app: str, redis_url: str,
                                  capsys: pytest.CaptureFixture[str]) -> None:
    p = _parser()
    args = p.parse_args(["bench", "load", "--rate", "50", "--duration", "0.2", user_app,
                         "ping", "--args", "[2]", "--redis-url", redis_url])
    assert args.handler(args) == 0
    out = capsys.readouterr().out
    assert "| run time p50 / p90 / p99 / p99.9 / max |" in out
    assert "| send lateness |" in out
    args = p.parse_args(["bench", "load", "--rate", "50", "--duration", "0.2", user_app,
                         "nope", "--redis-url", redis_url])
    assert args.handler(args) == 2
    assert "'nope' is not a task" in capsys.readouterr().err


def test_harness_commands_point_at_the_checkout(capsys: pytest.CaptureFixture[str]) -> None:
    args = _parser().parse_args(["bench", "drain", "--quick", "--jobs", "5"])
    assert args.handler is cli_bench.cmd_harness and args.rest == ["--quick", "--jobs", "5"]
    # every command of the harness is forwarded
    from bench.__main__ import COMMANDS
    assert set(cli_bench.HARNESS_COMMANDS) == set(COMMANDS)

    # the installed package never imports bench/: it says how to run the harness
    assert args.handler(args) == 2
    err = capsys.readouterr().err
    assert "source checkout" in err and "bench/" in err
    assert "python -m bench drain --quick --jobs 5" in err


def test_stop_children_ends_a_wedged_producer() -> None:
    """A producer that does not exit is stopped, not waited for forever (a wedged child
    once held a CI run until its budget ran out)."""
    ignores_term = subprocess.Popen(
        [sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, "
         "signal.SIG_IGN); print('up', flush=True); time.sleep(600)"],
        stdout=subprocess.PIPE)
    assert ignores_term.stdout is not None and ignores_term.stdout.readline() == b"up\n"
    quick = subprocess.Popen([sys.executable, "-c", "pass"])
    cli_bench._stop_children([quick, ignores_term], grace_s=0.5)
    assert quick.returncode == 0
    assert ignores_term.returncode == -9  # SIGTERM ignored: killed


def test_a_wedged_producer_prints_its_stacks_before_it_is_stopped() -> None:
    """Producers register ``faulthandler`` on SIGUSR1 (as ``--part`` runs do): the parent
    asks a wedged one for its stacks, so the log says where it hung."""
    wedged = subprocess.Popen(
        [sys.executable, "-c", "import faulthandler, signal, time\n"
         "faulthandler.register(signal.SIGUSR1, all_threads=True)\n"
         "def stuck_here():\n    print('up', flush=True)\n    time.sleep(600)\n"
         "stuck_here()\n"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert wedged.stdout is not None and wedged.stdout.readline() == b"up\n"
    cli_bench._stacks_then_stop([wedged])
    assert wedged.returncode == -15  # stopped (SIGTERM) after the dump
    assert wedged.stderr is not None
    err = wedged.stderr.read().decode()
    assert "stuck_here" in err and "Current thread" in err, err
