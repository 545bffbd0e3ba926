"""The alert rules through ``promtool``: syntax (``check rules``), behaviour (``test rules``
runs grafana/alerts.test.yml), the compose stack's Prometheus configuration, and the
dashboard's PromQL (checked as recording rules). Skipped only when promtool is not
installed (``apt-get install prometheus``; see the Makefile's ``tools`` target)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from opslib import (
    ALERTS,
    ALERTS_TEST,
    DEPLOY,
    REPO_ROOT,
    dashboard_exprs,
    find_tool,
    load_dashboard,
    to_promql,
)

PROMTOOL = find_tool("promtool")
pytestmark = [pytest.mark.unit,
              pytest.mark.skipif(PROMTOOL is None, reason="promtool is not installed")]


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    assert PROMTOOL is not None
    return subprocess.run([PROMTOOL, *args], cwd=REPO_ROOT, capture_output=True, text=True,
                          timeout=60, check=False)


def test_check_rules() -> None:
    out = promtool("check", "rules", str(ALERTS))
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS: 9 rules found" in out.stdout


def test_rule_unit_tests() -> None:
    out = promtool("test", "rules", str(ALERTS_TEST))
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS" in out.stdout


def test_compose_prometheus_config(tmp_path: Path) -> None:
    yaml = pytest.importorskip("yaml", reason="PyYAML is needed: pip install -e '.[test]'")
    config = yaml.safe_load((DEPLOY / "prometheus.yml").read_text(encoding="utf-8"))
    # the container path of the rules file, pointed at the repository's copy
    config["rule_files"] = [str(ALERTS) if r == "/etc/prometheus/alerts.yml" else r
                            for r in config["rule_files"]]
    path = tmp_path / "prometheus.yml"
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    out = promtool("check", "config", str(path))
    assert out.returncode == 0, out.stdout + out.stderr


def test_dashboard_promql_parses(tmp_path: Path) -> None:
    yaml = pytest.importorskip("yaml", reason="PyYAML is needed: pip install -e '.[test]'")
    exprs = dashboard_exprs(load_dashboard())
    rules = [{"record": f"batchq:dashboard_check:{i}", "expr": to_promql(expr)}
             for i, (_, expr) in enumerate(exprs)]
    path = tmp_path / "dashboard-rules.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}),
                    encoding="utf-8")
    out = promtool("check", "rules", str(path))
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"SUCCESS: {len(rules)} rules found" in out.stdout
