"""More hostile input to the ``batchq`` command, through the real CLI in a subprocess:
an endless line in ``enqueue --from``, empty queue names, ``--out r.png`` without
matplotlib, a producer with no Redis URL, and worker processes that cannot boot.

Every case ends with a message and an exit code, never a traceback, a loop or a run that
fails only at its end.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import cli_env, run_cli, start_cli, stop_proc, wait_until

import batchq
from tests.apps.ops_app import build

pytestmark = pytest.mark.fault

APP = "tests.apps.ops_app:app"
DEAD_URL = "redis://127.0.0.1:1/0"  # nothing listens on port 1


@pytest.fixture
def env(redis_url: str, namespace: str) -> dict[str, str | None]:
    return {"BATCHQ_REDIS_URL": redis_url, "BATCHQ_NAMESPACE": namespace,
            "BATCHQ_QUEUES": None, "BATCHQ_PROCESSES": None, "BATCHQ_BURST": None,
            "BATCHQ_LOG_FORMAT": None}


@pytest.fixture
def app(redis_url: str, namespace: str) -> Iterator[batchq.App]:
    a = build(redis_url, namespace)
    yield a
    a.close()


def one_line_exit_2(res: subprocess.CompletedProcess[str], named: str) -> str:
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 2, f"exit {res.returncode}\n{res.stdout}{res.stderr}"
    assert len(lines) == 1 and named in lines[0], res.stderr
    assert "Traceback" not in res.stdout + res.stderr
    return lines[0]


# --- enqueue --from: a line too long is skipped, never held whole ---------------------------

_PEAK_RSS = ("import resource, sys\n"
             "from batchq.cli import main\n"
             "code = main(sys.argv[1:])\n"
             "print('peak-rss-kib', resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,"
             " file=sys.stderr)\n"
             "sys.exit(code)\n")


def _enqueue_measured(src: Path, env: dict[str, str | None], *flags: str
                      ) -> tuple[subprocess.CompletedProcess[str], int]:
    res = subprocess.run([sys.executable, "-c", _PEAK_RSS, "enqueue", APP, "record",
                          "--from", str(src), *flags],
                         env=cli_env(env), capture_output=True, text=True, timeout=120,
                         check=False)
    m = re.search(r"peak-rss-kib (\d+)", res.stderr)
    assert m, res.stderr
    return res, int(m.group(1))


def test_a_64_mib_line_is_skipped_in_bounded_memory(app: batchq.App,
                                                    env: dict[str, str | None],
                                                    tmp_path: Path) -> None:
    small = tmp_path / "small.jsonl"
    small.write_text('{"args": [1]}\n{"args": [2]}\n')
    _, baseline_kib = _enqueue_measured(small, env)

    src = tmp_path / "huge.jsonl"
    with src.open("wb") as f:
        f.write(b'{"args": [1]}\n')
        chunk = b"\0" * (1 << 20)
        for _ in range(64):
            f.write(chunk)
        f.write(b'\n{"args": [3]}\n')
    res, peak_kib = _enqueue_measured(src, env)
    assert res.returncode == 0, res.stdout + res.stderr
    assert re.search(r"^2 enqueued, 1 skipped", res.stdout, re.M), res.stdout
    assert f"{src}:2: line of 67,108,864 bytes, above the limit of 2,097,152 " \
           "(--max-line-bytes)" in res.stderr, res.stderr
    assert "Traceback" not in res.stderr
    # the line is read past in chunks: a copy of it (64 MiB) never exists
    assert peak_kib - baseline_kib < 32 * 1024, (baseline_kib, peak_kib)
    print(f"peak RSS {baseline_kib} KiB for 2 lines, {peak_kib} KiB with a 64 MiB line")
    state = json.loads(Path(str(src) + ".batchq-progress").read_text())
    assert state["finished"] is True and state["next_line"] == 4
    assert app.queue("bulk").stats().ready == 4  # two from each file


def test_max_line_bytes_sets_the_cap_and_abort_stops_there(
        app: batchq.App, env: dict[str, str | None], tmp_path: Path) -> None:
    src = tmp_path / "long.jsonl"
    long_line = json.dumps({"args": [1, "x" * 2000]})
    src.write_text("\n".join(['{"args": [1]}', long_line, '{"args": [3]}']) + "\n")
    res = run_cli(["enqueue", APP, "record", "--from", str(src), "--max-line-bytes", "1000",
                   "--on-error", "abort"], env=env, timeout_s=60)
    assert res.returncode == 1, res.stdout + res.stderr
    assert f"{src}:2: line of {len(long_line):,} bytes, above the limit of 1,000" \
        in res.stderr, res.stderr
    assert "aborted at line 2: 1 enqueued" in res.stderr, res.stderr
    # a line exactly at the cap is read
    res = run_cli(["enqueue", APP, "record", "--from", str(src), "--again",
                   "--max-line-bytes", str(len(long_line))], env=env, timeout_s=60)
    assert res.returncode == 0 and re.search(r"^3 enqueued, 0 skipped", res.stdout, re.M), \
        res.stdout + res.stderr


@pytest.mark.parametrize("value", ["0", "-1", "1e20", str(2**63), "2000000000"])
def test_a_bad_max_line_bytes_exits_2(value: str, env: dict[str, str | None]) -> None:
    one_line_exit_2(run_cli(["enqueue", APP, "record", "--from", "x.jsonl",
                             "--max-line-bytes", value], env=env, timeout_s=30),
                    "--max-line-bytes")


# --- empty queue names ------------------------------------------------------------------------


@pytest.mark.parametrize(("args", "named"), [
    (["worker", APP, "--burst", "-q", ""], "-q/--queues"),
    (["worker", APP, "--burst", "-q", " "], "-q/--queues"),
    (["worker", APP, "--burst", "-q", "default,,side"], "-q/--queues"),
    (["worker", APP, "--burst", "-q", "default,"], "-q/--queues"),
    (["worker", APP, "--burst", "--queues="], "-q/--queues"),
    (["dead", "list", APP, ""], "invalid queue name"),
    (["dead", "retry", "", "--all"], "invalid queue name"),
    (["pause", ""], "invalid queue name"),
    (["resume", APP, ""], "invalid queue name"),
    (["limit", "set", "", "--rate", "5"], "invalid queue name"),
    (["limit", "list", APP, ""], "invalid queue name"),
])
def test_an_empty_queue_name_is_refused(args: list[str], named: str,
                                        env: dict[str, str | None]) -> None:
    one_line_exit_2(run_cli(args, env=env, timeout_s=30), named)


def test_queues_from_an_empty_variable_mean_every_queue(app: batchq.App,
                                                        env: dict[str, str | None]) -> None:
    """``BATCHQ_QUEUES=`` is the variable unset (every queue), not an empty name."""
    app.tasks["side"].enqueue(1)
    res = run_cli(["worker", APP, "--burst"], env={**env, "BATCHQ_QUEUES": ""}, timeout_s=60)
    assert res.returncode == 0, res.stdout + res.stderr
    assert app.queue("side").stats().ready == 0


# --- bench load --out r.png without matplotlib --------------------------------------------------


def test_a_png_without_matplotlib_is_refused_before_the_run(tmp_path: Path) -> None:
    fake = tmp_path / "matplotlib"
    fake.mkdir()
    (fake / "__init__.py").write_text("raise ImportError('matplotlib hidden by the test')\n")
    res = run_cli(["bench", "load", APP, "add", "--rate", "5", "--duration", "1", "--out",
                   str(tmp_path / "r.png")],
                  env={"PYTHONPATH": str(tmp_path), "BATCHQ_REDIS_URL": DEAD_URL},
                  timeout_s=30)
    line = one_line_exit_2(res, "pip install 'batchq[bench]'")
    assert "--out" in line and "matplotlib" in line
    assert not (tmp_path / "r.png").exists()


# --- a producer that falls back to the default URL says so, once ---------------------------------

_PRODUCER = ("import batchq\n"
             "a = batchq.App(namespace='one')\n"
             "b = batchq.App(namespace='two')\n"
             "print(a.redis_url == b.redis_url)\n")


def test_the_default_redis_url_is_announced_once_per_process() -> None:
    # nothing connects: the warning comes when the URL is chosen
    res = subprocess.run([sys.executable, "-c", _PRODUCER],
                         env=cli_env({"BATCHQ_REDIS_URL": None}), capture_output=True,
                         text=True, timeout=60, check=False)
    assert res.returncode == 0 and res.stdout.strip() == "True", res
    warnings = [line for line in res.stderr.splitlines() if "BATCHQ_REDIS_URL" in line]
    assert len(warnings) == 1, res.stderr
    assert "redis://127.0.0.1:6379/0" in warnings[0], res.stderr

    res = subprocess.run([sys.executable, "-c", _PRODUCER],
                         env=cli_env({"BATCHQ_REDIS_URL": DEAD_URL}), capture_output=True,
                         text=True, timeout=60, check=False)
    assert res.returncode == 0 and not res.stderr, res


# --- worker processes that cannot boot stop the supervisor --------------------------------------


def test_children_that_exit_at_once_on_first_start_stop_the_supervisor(
        env: dict[str, str | None]) -> None:
    proc = start_cli(["worker", "apps.boot_fail_app:app", "-p", "2", "--no-metrics",
                      "--metrics-port", "0"], env=env)
    try:
        t0 = time.monotonic()
        wait_until(lambda: proc.poll() is not None, 30,
                   message=f"the supervisor is still replacing its children:\n"
                   f"{proc.read_log()[-2000:]}")
        log = proc.read_log()
        assert proc.returncode == 1, log
        assert "could not boot (exit code 1): stopping" in log, log
        assert log.count("replacing it") == 0, log  # never a crash loop
        assert time.monotonic() - t0 < 30
    finally:
        if proc.poll() is None:
            stop_proc(proc)


# --- one rule for the app argument ---------------------------------------------------------------


def test_a_bare_module_is_an_app_wherever_an_app_is_taken(app: batchq.App,
                                                          env: dict[str, str | None]) -> None:
    module = APP.partition(":")[0]  # its attribute `app` is the App
    for args in (["info", module, "--json"], ["campaign", "list", module, "--json"]):
        res = run_cli(args, env=env, timeout_s=30)
        assert res.returncode == 0, (args, res.stderr)
        assert json.loads(res.stdout), res.stdout
    res = run_cli(["campaign", "list", module, "extra"], env=env, timeout_s=30)
    one_line_exit_2(res, "list takes no campaign id")
