"""Shared by the tests of grafana/ and deploy/: paths, the metric names batchq exports,
PromQL extraction from the dashboard and the alert rules, finding the Prometheus tools."""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]
GRAFANA = REPO_ROOT / "grafana"
DEPLOY = REPO_ROOT / "deploy"
DASHBOARD = GRAFANA / "dashboards" / "batchq.json"
ALERTS = GRAFANA / "alerts.yml"
ALERTS_TEST = GRAFANA / "alerts.test.yml"

# Every metric `batchq worker` exports (processes, then read from Redis at scrape time).
COUNTERS = frozenset({
    "batchq_jobs_started_total",
    "batchq_jobs_succeeded_total",
    "batchq_jobs_failed_total",
    "batchq_jobs_retried_total",
    "batchq_jobs_dead_total",
    "batchq_jobs_redelivered_total",
    "batchq_stale_acks_total",
    "batchq_worker_restarts_total",
    "batchq_jobs_enqueued_total",
    "batchq_jobs_handed_off_total",
    "batchq_jobs_rate_limited_total",
    "batchq_jobs_cancelled_total",
    "batchq_jobs_expired_total",
})
HISTOGRAMS = frozenset({
    "batchq_job_run_seconds",
    "batchq_job_wait_seconds",
    "batchq_fetch_batch_size",
    "batchq_redis_seconds",
})
GAUGES = frozenset({
    "batchq_jobs_in_progress",
    "batchq_worker_concurrency",
    "batchq_worker_processes",
    "batchq_build_info",
    "batchq_queue_jobs",
    "batchq_queue_oldest_job_age_seconds",
    "batchq_queue_delayed_lag_seconds",
    "batchq_queue_paused",
    "batchq_periodic_next_run_timestamp_seconds",
    "batchq_campaign_jobs",
    "batchq_campaign_done",
    "batchq_queue_grouped_jobs",
    "batchq_queue_groups",
    "batchq_queue_held_seconds",
    "batchq_limit_concurrency_used_ratio",
    "batchq_limit_rate_per_second",
    "batchq_group_waiting_seconds",
})
EXPORTED = COUNTERS | HISTOGRAMS | GAUGES
"""(``batchq_periodic_last_run_timestamp_seconds`` too, once a periodic task ran: the
live test's yearly task never does, so it is not listed.)"""

WITH_QUEUE_LABEL = frozenset({
    "batchq_jobs_started_total", "batchq_jobs_succeeded_total", "batchq_jobs_failed_total",
    "batchq_jobs_retried_total", "batchq_jobs_dead_total", "batchq_jobs_redelivered_total",
    "batchq_stale_acks_total", "batchq_job_run_seconds", "batchq_job_wait_seconds",
    "batchq_fetch_batch_size", "batchq_jobs_in_progress", "batchq_queue_jobs",
    "batchq_queue_oldest_job_age_seconds", "batchq_queue_delayed_lag_seconds",
    "batchq_queue_paused", "batchq_jobs_enqueued_total", "batchq_jobs_handed_off_total",
    "batchq_periodic_next_run_timestamp_seconds", "batchq_jobs_rate_limited_total",
    "batchq_queue_grouped_jobs", "batchq_queue_groups", "batchq_queue_held_seconds",
    "batchq_limit_concurrency_used_ratio", "batchq_limit_rate_per_second",
    "batchq_group_waiting_seconds", "batchq_jobs_cancelled_total", "batchq_jobs_expired_total",
})
"""Metrics with a ``queue`` label: the dashboard must filter them by ``$queue``."""

METRIC_RE = re.compile(r"batchq_[a-z_]+")
HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")


def base_name(name: str) -> str:
    """``batchq_x_seconds_bucket`` -> ``batchq_x_seconds`` for histogram series."""
    for suffix in HISTOGRAM_SUFFIXES:
        if name.endswith(suffix) and name[: -len(suffix)] in HISTOGRAMS:
            return name[: -len(suffix)]
    return name


def metric_names(text: str) -> set[str]:
    """The batchq metric names in ``text`` (histogram series reduced to their name)."""
    return {base_name(m) for m in METRIC_RE.findall(text)}


def load_dashboard() -> dict[str, Any]:
    with DASHBOARD.open(encoding="utf-8") as f:
        data: dict[str, Any] = json.load(f)
    return data


def dashboard_panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    """Every panel, including those nested in collapsed rows."""
    out: list[dict[str, Any]] = []
    for panel in dashboard.get("panels", []):
        out.append(panel)
        out.extend(panel.get("panels", []))
    return out


def dashboard_exprs(dashboard: dict[str, Any]) -> list[tuple[str, str]]:
    """``(panel title / refId, expr)`` of every panel target."""
    return [(f"{p.get('title')} / {t.get('refId')}", t["expr"])
            for p in dashboard_panels(dashboard) if p.get("type") != "row"
            for t in p.get("targets", [])]


def load_alert_rules() -> list[dict[str, Any]]:
    import yaml

    with ALERTS.open(encoding="utf-8") as f:
        data = yaml.safe_load(f)
    return [rule for group in data["groups"] for rule in group["rules"]]


_GRAFANA_VARS = {
    "__rate_interval": "1m",
    "__interval": "15s",
    "__interval_ms": "15000",
    "__range": "5m",
    "__range_s": "300",
    "__range_ms": "300000",
}


def to_promql(expr: str, queue: str = ".*") -> str:
    """A dashboard expression with Grafana's variables replaced (``$queue`` by ``queue``,
    ``$__rate_interval`` by 1m, ...): plain PromQL for the HTTP API."""
    values = dict(_GRAFANA_VARS, queue=queue)

    def sub(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(2)
        if name not in values:
            raise KeyError(f"unknown Grafana variable ${name} in {expr!r}")
        return values[name]

    return re.sub(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)", sub, expr)


def find_tool(name: str) -> str | None:
    """A Prometheus binary on PATH, else the Debian package's /usr/bin one."""
    found = shutil.which(name)
    if found:
        return found
    fallback = f"/usr/bin/{name}"
    return fallback if os.access(fallback, os.X_OK) else None
