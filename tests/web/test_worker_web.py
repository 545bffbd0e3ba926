"""``batchq worker --web`` through the real command: the console served from the
supervisor's metrics process (``-p``) or from a thread of a lone worker, stopped with
everything else by SIGTERM; an unsafe console refused (exit 2) before anything forks.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator

import pytest
from helpers import CliProcess, alive, children, free_port, run_cli
from workers import WorkerProcs, worker_env

import batchq

from .conftest import APP_REF, http, wait_answer

pytestmark = pytest.mark.e2e

APP_QUEUES = {"default", "side", "bulk"}


@pytest.fixture
def procs(redis_url: str, capp: batchq.App) -> Iterator[WorkerProcs]:
    env = worker_env({"BATCHQ_REDIS_URL": redis_url, "BATCHQ_NAMESPACE": capp.namespace})
    with WorkerProcs(APP_REF, env) as started:
        yield started


def serves_the_console(proc: CliProcess, port: int) -> None:
    url = f"http://127.0.0.1:{port}/"
    assert wait_answer(url, proc, proc.read_log).status == 200
    info = http("GET", url + "api/info")
    assert info.status == 200
    assert set(info.json()["queues"]) >= APP_QUEUES, info.json()


def stops_on_sigterm(proc: CliProcess, port: int) -> None:
    family = children(proc.pid)
    assert proc.stop(signal.SIGTERM, timeout_s=30) == 0, proc.read_log()
    assert not any(alive(pid) for pid in family), proc.read_log()
    with pytest.raises(OSError):
        http("GET", f"http://127.0.0.1:{port}/")
    assert "Traceback" not in proc.read_log(), proc.read_log()


def test_supervisor_serves_the_console_from_its_metrics_process(procs: WorkerProcs) -> None:
    port, metrics = free_port(), free_port()
    proc = procs.start("-p", "1", "--web", "--web-port", str(port),
                       "--metrics-port", str(metrics))
    serves_the_console(proc, port)
    assert http("GET", f"http://127.0.0.1:{metrics}/healthz").status == 200
    [line] = [ln for ln in proc.read_log().splitlines() if "web console on" in ln]
    assert "[metrics " in line, line  # the metrics process, not the supervisor
    stops_on_sigterm(proc, port)


def test_web_without_metrics_still_has_its_process(procs: WorkerProcs) -> None:
    """--no-metrics: no /metrics, but the process still runs for the console; the
    settings come from the environment."""
    port = free_port()
    proc = procs.start("-p", "1", "--no-metrics",
                       env={"BATCHQ_WEB": "1", "BATCHQ_WEB_PORT": str(port),
                            "BATCHQ_WEB_READ_ONLY": "true"})
    serves_the_console(proc, port)
    page = http("GET", f"http://127.0.0.1:{port}/").text
    assert 'content="1"' in page.split("batchq-read-only", 1)[1][:20]
    stops_on_sigterm(proc, port)


def test_a_lone_worker_serves_the_console_from_a_thread(procs: WorkerProcs) -> None:
    port = free_port()
    proc = procs.start("--web", "--web-port", str(port))
    serves_the_console(proc, port)
    stops_on_sigterm(proc, port)


@pytest.mark.parametrize(("args", "env", "text"), [
    (["-p", "1", "--web", "--web-addr", "0.0.0.0"], {}, "without a token"),
    ([], {"BATCHQ_WEB": "yes", "BATCHQ_WEB_ADDR": "::"}, "without a token"),
    (["-p", "1", "--web", "--web-token", "short"], {}, "too short (5 characters"),
    (["--web-port", "65536"], {}, "--web-port: must be a port number"),
    ([], {"BATCHQ_WEB_PORT": "x"}, "bad value for BATCHQ_WEB_PORT"),
])
def test_an_unsafe_or_bad_console_exits_2_before_anything_starts(
        redis_url: str, capp: batchq.App, args: list[str], env: dict[str, str],
        text: str) -> None:
    res = run_cli(["worker", APP_REF, *args],
                  env=worker_env({"BATCHQ_REDIS_URL": redis_url,
                                  "BATCHQ_NAMESPACE": capp.namespace, **env}), timeout_s=30)
    assert res.returncode == 2, res
    assert text in res.stderr, res.stderr
    assert "Traceback" not in res.stderr
    assert " serving " not in res.stderr  # no worker started
