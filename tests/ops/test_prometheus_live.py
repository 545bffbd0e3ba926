"""The real thing: a real Prometheus scrapes a real ``batchq worker -p 2`` every second
and evaluates grafana/alerts.yml, while the test runs jobs through every outcome
(success, failure with retry, timeout, unknown task, delay, an expired lease) and holds a
rate- and concurrency-limited group (flow control). Then every PromQL expression of the
dashboard and of the alert rules is run through Prometheus' HTTP API, and every metric
name they use must be exported by the workers.

Skipped only when no ``prometheus`` binary is installed (Debian package ``prometheus``).
"""

from __future__ import annotations

import json
import signal
import subprocess
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from apps import metrics_app
from helpers import CliProcess, free_port, start_cli, stop_proc, wait_until
from opslib import (
    ALERTS,
    EXPORTED,
    base_name,
    dashboard_exprs,
    find_tool,
    load_alert_rules,
    load_dashboard,
    metric_names,
    to_promql,
)

PROMETHEUS = find_tool("prometheus")
pytestmark = [pytest.mark.e2e,
              pytest.mark.skipif(PROMETHEUS is None, reason="prometheus is not installed"),
              pytest.mark.timeout(120)]

APP_REF = "tests.apps.metrics_app:app"
QUEUE = metrics_app.QUEUE
WAVE_OK, WAVE_FAIL, WAVE_TIMEOUT, WAVE_LATER, WAVE_GHOST = 50, 5, 3, 5, 1
WAVES = 2
EXPECTED_DEAD = WAVES * (WAVE_FAIL + WAVE_TIMEOUT + WAVE_GHOST)
EXPECTED_SUCCEEDED = WAVES * (WAVE_OK + WAVE_LATER) + 1  # + the hog, on its second try


def http_get(url: str, timeout_s: float = 5.0) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except OSError as exc:
        return 0, str(exc)


@dataclass
class Stack:
    prom_url: str
    metrics_url: str
    worker: CliProcess
    prom_log: Path

    def api(self, path: str, **params: str) -> Any:
        url = f"{self.prom_url}/api/v1/{path}"
        if params:
            url += "?" + urllib.parse.urlencode(params)
        code, body = http_get(url)
        assert code == 200, f"GET {url}: {code} {body}"
        data = json.loads(body)
        assert data["status"] == "success", data
        return data["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        url = f"{self.prom_url}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
        code, body = http_get(url)
        assert code == 200, f"query failed ({code}): {expr}\n{body}"
        data = json.loads(body)
        assert data["status"] == "success", data
        assert data["data"]["resultType"] == "vector", (expr, data["data"]["resultType"])
        result: list[dict[str, Any]] = data["data"]["result"]
        return result

    def value(self, expr: str) -> float | None:
        res = self.query(expr)
        return float(res[0]["value"][1]) if res else None

    def diagnostics(self) -> str:
        _, metrics = http_get(self.metrics_url)
        return (f"--- worker log ---\n{self.worker.read_log()[-4000:]}\n"
                f"--- prometheus log ---\n{self.prom_log.read_text(errors='replace')[-3000:]}\n"
                f"--- /metrics (batchq_jobs lines) ---\n"
                + "\n".join(ln for ln in metrics.splitlines()
                            if ln.startswith("batchq_jobs_"))[:4000])


def start_prometheus(tmp: Path, target: str, port: int) -> tuple[subprocess.Popen[bytes], Path]:
    assert PROMETHEUS is not None
    config = {
        "global": {"scrape_interval": "1s", "scrape_timeout": "900ms",
                   "evaluation_interval": "1s"},
        "rule_files": [str(ALERTS)],
        "scrape_configs": [{"job_name": "batchq",
                            "static_configs": [{"targets": [target]}]}],
    }
    cfg = tmp / "prometheus.yml"
    cfg.write_text(json.dumps(config), encoding="utf-8")  # JSON is YAML
    log = tmp / "prometheus.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [PROMETHEUS, f"--config.file={cfg}", f"--storage.tsdb.path={tmp / 'data'}",
             f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
            stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT)
    return proc, log


def run_scenario(stack: Stack, redis_url: str, namespace: str) -> None:
    """Enqueue every kind of job and wait until Prometheus has seen all of them."""
    producer = metrics_app.build(redis_url, namespace)

    @producer.task(queue=QUEUE, name="ghost")
    def ghost(i: int) -> None:  # not registered in the worker: dead as unknown_task
        pass

    tasks = producer.tasks
    try:
        # The hog first, alone: it blocks one worker process past its lease, the other
        # process takes the job again (redelivered), the first one's ack comes too late.
        tasks["hog"].enqueue(0)
        wait_until(lambda: producer.redis.llen(metrics_app.hog_key(namespace)) >= 1,
                   timeout_s=15, message="the hog job did not start")

        # flow control: limits on the flow queue, and a limited group held for an hour
        # with a job waiting (its waiting seconds, the group-held alert's expression)
        flow = producer.queue(metrics_app.FLOW_QUEUE)
        flow.limit(rate_per_s=1000)
        flow.limit(group="acme", rate_per_s=5, concurrency=2)
        flow.hold(3600, group="acme")
        tasks["limited"].options(group="acme").enqueue(0)

        # the ok jobs form a campaign, so the campaign panels have data
        campaign = producer.campaign("ops-scenario")

        def wave() -> None:
            tasks["ok"].options(campaign=campaign).enqueue_many(range(WAVE_OK))
            tasks["fail"].enqueue_many(range(WAVE_FAIL))
            tasks["sleepy"].enqueue_many(range(WAVE_TIMEOUT))
            tasks["later"].options(delay_s=1.0).enqueue_many(range(WAVE_LATER))
            ghost.enqueue_many(range(WAVE_GHOST))

        wave()
        # the second wave only once Prometheus has the first one's dead-letter series:
        # then increase() over them has something to see
        wave_dead = EXPECTED_DEAD // WAVES
        wait_until(lambda: (stack.value("sum(batchq_jobs_dead_total)") or 0) >= wave_dead,
                   timeout_s=20, interval_s=0.2, message="first wave not scraped")
        wave()
        campaign.seal()

        def settled() -> bool:
            return (stack.value("sum(batchq_jobs_dead_total)") == EXPECTED_DEAD
                    and stack.value("sum(batchq_jobs_succeeded_total)") == EXPECTED_SUCCEEDED
                    and (stack.value("sum(batchq_stale_acks_total)") or 0) >= 1
                    and (stack.value("sum(batchq_jobs_redelivered_total)") or 0) >= 1
                    and stack.value(f'sum(batchq_queue_jobs{{queue="{QUEUE}", '
                                    'state=~"ready|delayed|reserved"})') == 0
                    and stack.value('max(batchq_group_waiting_seconds{group="acme"})')
                    and stack.value('max(batchq_campaign_jobs{state="succeeded"})')
                    == WAVES * WAVE_OK)

        wait_until(settled, timeout_s=30, interval_s=0.25,
                   message="Prometheus never saw every job finish")
        # rate() needs two samples of a series: three more scrapes give the newest
        # series (born in the last scrape seen) three
        scrapes = 'sum(count_over_time(up{job="batchq"}[1h]))'
        seen = stack.value(scrapes) or 0
        wait_until(lambda: (stack.value(scrapes) or 0) >= seen + 3, timeout_s=10,
                   interval_s=0.25, message="prometheus stopped scraping")
        wait_until(lambda: stack.query(
            'ALERTS{alertname="BatchqDeadLettersGrowing", alertstate="firing"}'),
            timeout_s=10, interval_s=0.25, message="BatchqDeadLettersGrowing never fired")
    finally:
        producer.close()


@pytest.fixture(scope="module")
def stack(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    tmp = tmp_path_factory.mktemp("prometheus")
    namespace = f"prom{uuid.uuid4().hex[:10]}"
    metrics_port, prom_port = free_port(), free_port()
    worker = start_cli(
        ["worker", APP_REF, "-p", "2", "--metrics-port", str(metrics_port), "--lease-s", "2",
         "--log-level", "WARNING"],
        env={"BATCHQ_REDIS_URL": redis_url, "METRICS_APP_NS": namespace,
             "PROMETHEUS_MULTIPROC_DIR": None, "BATCHQ_METRICS_ADDR": None,
             "BATCHQ_METRICS_PORT": None, "BATCHQ_NO_METRICS": None,
             "BATCHQ_PROCESSES": None, "BATCHQ_QUEUES": None})
    prom, prom_log = start_prometheus(tmp, f"127.0.0.1:{metrics_port}", prom_port)
    s = Stack(f"http://127.0.0.1:{prom_port}", f"http://127.0.0.1:{metrics_port}/metrics",
              worker, prom_log)
    try:
        try:
            wait_until(lambda: "batchq_worker_processes 2.0" in http_get(s.metrics_url)[1],
                       timeout_s=20, interval_s=0.1, message="workers never reported 2 "
                       "processes on /metrics")
            wait_until(lambda: http_get(f"{s.prom_url}/-/ready")[0] == 200, timeout_s=20,
                       interval_s=0.1, message="prometheus not ready")
            wait_until(lambda: s.value('up{job="batchq"}') == 1, timeout_s=20,
                       interval_s=0.2, message="prometheus cannot scrape the workers")
            run_scenario(s, redis_url, namespace)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{s.diagnostics()}") from None
        yield s
    finally:
        stop_proc(prom, sig=signal.SIGTERM, timeout_s=10)
        stop_proc(worker, sig=signal.SIGTERM, timeout_s=15)


def test_health_endpoints(stack: Stack) -> None:
    base = stack.metrics_url.rsplit("/", 1)[0]
    assert http_get(f"{base}/healthz")[0] == 200
    assert http_get(f"{base}/readyz")[0] == 200


def test_every_dashboard_query_returns_data(stack: Stack) -> None:
    empty = []
    for where, expr in dashboard_exprs(load_dashboard()):
        if not stack.query(to_promql(expr)):
            empty.append(f"{where}: {to_promql(expr)}")
    assert not empty, "dashboard queries without data:\n" + "\n".join(empty)


def test_queue_variable_lists_the_queue(stack: Stack) -> None:
    values = stack.api("label/queue/values", **{"match[]": "batchq_queue_jobs"})
    assert QUEUE in values


# what the scenario must make each alert expression say right now (None: either)
ALERT_EXPECTATIONS: dict[str, bool | None] = {
    "BatchqQueueBackingUp": False,
    "BatchqHighFailureRate": True,     # 26 failed of 138 attempts: 19 %, over the guard
    "BatchqDeadLettersGrowing": True,
    "BatchqNoWorkers": False,
    "BatchqWorkersRestarting": False,
    "BatchqRedisSlow": None,           # a slow CI box may legitimately trip it
    "BatchqPeriodicStalled": False,    # the yearly task's next run is months ahead
    "BatchqGroupHeld": True,           # acme is held for an hour (pending: for 5m)
    "BatchqQueueHeld": False,
}


def test_every_alert_expression_evaluates(stack: Stack) -> None:
    rules = load_alert_rules()
    assert {r["alert"] for r in rules} == set(ALERT_EXPECTATIONS)
    wrong = []
    for rule in rules:
        result = stack.query(rule["expr"])
        expected = ALERT_EXPECTATIONS[rule["alert"]]
        if expected is not None and bool(result) != expected:
            wrong.append(f"{rule['alert']}: expected {'data' if expected else 'nothing'}, "
                         f"got {result}")
    assert not wrong, "\n".join(wrong)


def test_prometheus_evaluates_every_rule_cleanly(stack: Stack) -> None:
    groups = stack.api("rules")["groups"]
    rules = [r for g in groups for r in g["rules"]]
    assert {r["name"] for r in rules} == set(ALERT_EXPECTATIONS)
    for r in rules:
        assert r["health"] == "ok", (r["name"], r.get("lastError"))
    firing = {a["labels"]["alertname"]: a for a in stack.api("alerts")["alerts"]}
    dead = firing["BatchqDeadLettersGrowing"]
    assert dead["state"] == "firing"
    assert dead["labels"]["queue"] == QUEUE
    assert dead["labels"]["severity"] == "warning"
    assert "batchq dead list default" in dead["annotations"]["description"]
    assert firing["BatchqHighFailureRate"]["state"] == "pending"  # for: 5m


def exported_names(metrics_text: str) -> set[str]:
    names = set()
    for line in metrics_text.splitlines():
        if line and not line.startswith("#"):
            names.add(line.split("{", 1)[0].split(" ", 1)[0])
    return {base_name(n) for n in names if n.startswith("batchq_")}


def test_every_metric_used_is_exported(stack: Stack) -> None:
    code, text = http_get(stack.metrics_url)
    assert code == 200
    exported = exported_names(text)
    used = set().union(*(metric_names(e) for _, e in dashboard_exprs(load_dashboard())))
    used |= set().union(*(metric_names(r["expr"]) for r in load_alert_rules()))
    assert used - exported == set(), f"used but not exported: {sorted(used - exported)}"
    # and the names the dashboards were designed against are all real
    assert EXPORTED - exported == set(), f"never exported: {sorted(EXPORTED - exported)}"


def test_job_counts_reached_prometheus(stack: Stack) -> None:
    """The numbers behind the panels are the numbers of jobs the scenario ran."""

    def by(labels: str, metric: str) -> dict[tuple[str, ...], float]:
        names = [n.strip() for n in labels.split(",")]
        return {tuple(r["metric"].get(n, "") for n in names): float(r["value"][1])
                for r in stack.query(f"sum by ({labels}) ({metric}) > 0")}

    assert by("task, reason", "batchq_jobs_failed_total") == {
        ("fail", "failed"): WAVES * WAVE_FAIL * 2,
        ("sleepy", "timeout"): WAVES * WAVE_TIMEOUT,
    }
    assert by("reason", "batchq_jobs_dead_total") == {
        ("failed",): WAVES * WAVE_FAIL,
        ("timeout",): WAVES * WAVE_TIMEOUT,
        ("unknown_task",): WAVES * WAVE_GHOST,
    }
    assert by("task", "batchq_jobs_retried_total") == {("fail",): WAVES * WAVE_FAIL}
    assert stack.value("sum(batchq_jobs_succeeded_total)") == EXPECTED_SUCCEEDED
    assert stack.value("sum(batchq_worker_processes)") == 2
    assert stack.value(f'max(batchq_queue_jobs{{queue="{QUEUE}", state="dead"}})') == \
        EXPECTED_DEAD
    assert stack.value("count(batchq_build_info)") == 1
    # delayed jobs were promoted on time: nothing overdue is left
    assert stack.value("max(batchq_queue_delayed_lag_seconds)") == 0
