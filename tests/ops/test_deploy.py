"""Static checks of grafana/ and deploy/: every file parses, and the fields that matter
(probes, grace periods, ports, images, the KEDA list key, metric names) agree with each
other and with the batchq package."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from opslib import (
    ALERTS,
    DASHBOARD,
    DEPLOY,
    EXPORTED,
    GRAFANA,
    HISTOGRAMS,
    REPO_ROOT,
    WITH_QUEUE_LABEL,
    base_name,
    dashboard_exprs,
    dashboard_panels,
    load_alert_rules,
    load_dashboard,
    metric_names,
)

from batchq.store.keys import QueueKeys

pytestmark = pytest.mark.unit

yaml = pytest.importorskip("yaml", reason="PyYAML is needed: pip install -e '.[test]'")

K8S_BASE = DEPLOY / "k8s" / "base"
K8S_PROD = DEPLOY / "k8s" / "overlays" / "production"
SHUTDOWN_TIMEOUT_S = 30


def load(path: Path) -> Any:
    with path.open(encoding="utf-8") as f:
        return yaml.safe_load(f)


def load_all(path: Path) -> list[Any]:
    with path.open(encoding="utf-8") as f:
        return [d for d in yaml.safe_load_all(f) if d is not None]


def seconds(value: str | int | float) -> float:
    """'45s', '1m30s', 45 -> seconds."""
    if isinstance(value, int | float):
        return float(value)
    parts = re.fullmatch(r"(?:(\d+)m)?(?:(\d+(?:\.\d+)?)s)?", value.strip())
    assert parts and value.strip(), f"not a duration: {value!r}"
    return int(parts.group(1) or 0) * 60 + float(parts.group(2) or 0)


def env_of(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env", [])}


# --- every file parses --------------------------------------------------------------------


YAML_FILES = sorted([*GRAFANA.rglob("*.yml"), *GRAFANA.rglob("*.yaml"),
                     *DEPLOY.rglob("*.yml"), *DEPLOY.rglob("*.yaml")])


def test_the_expected_files_exist() -> None:
    expected = [
        DASHBOARD, ALERTS, GRAFANA / "alerts.test.yml",
        GRAFANA / "provisioning" / "datasources" / "prometheus.yml",
        GRAFANA / "provisioning" / "dashboards" / "batchq.yml",
        DEPLOY / "Dockerfile", DEPLOY / "entrypoint.sh", DEPLOY / "compose.yml",
        DEPLOY / "prometheus.yml", DEPLOY / "README.md",
        K8S_BASE / "kustomization.yaml", K8S_BASE / "deployment.yaml",
        K8S_BASE / "service.yaml", K8S_BASE / "secret.yaml", K8S_BASE / "servicemonitor.yaml",
        K8S_BASE / "keda-scaledobject.yaml", K8S_PROD / "kustomization.yaml",
    ]
    missing = [str(p.relative_to(REPO_ROOT)) for p in expected if not p.is_file()]
    assert not missing, f"missing: {missing}"


@pytest.mark.parametrize("path", YAML_FILES, ids=lambda p: str(p.relative_to(REPO_ROOT)))
def test_yaml_parses(path: Path) -> None:
    docs = load_all(path)
    assert docs, f"{path} is empty"
    for doc in docs:
        assert isinstance(doc, dict), f"{path}: a document is not a mapping"


# --- dashboard ----------------------------------------------------------------------------


def test_dashboard_identity_and_variables() -> None:
    d = load_dashboard()
    assert d["uid"] == "batchq"
    assert d["title"] == "batchq"
    assert 36 <= d["schemaVersion"] <= 41
    variables = {v["name"]: v for v in d["templating"]["list"]}
    ds = variables["datasource"]
    assert ds["type"] == "datasource"
    assert ds["query"] == "prometheus"
    q = variables["queue"]
    assert q["type"] == "query"
    query = q["query"]["query"] if isinstance(q["query"], dict) else q["query"]
    assert re.sub(r"\s", "", query) == "label_values(batchq_queue_jobs,queue)"
    assert q["multi"] is True
    assert q["includeAll"] is True
    assert q["datasource"]["uid"] == "${datasource}"


def test_every_panel_has_targets_on_the_datasource_variable() -> None:
    panels = [p for p in dashboard_panels(load_dashboard()) if p.get("type") != "row"]
    assert len(panels) >= 12
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    for p in panels:
        assert p.get("title"), p
        targets = p.get("targets")
        assert targets, f"panel {p['title']!r} has no targets"
        assert p["datasource"]["uid"] == "${datasource}", p["title"]
        refs = [t["refId"] for t in targets]
        assert len(refs) == len(set(refs)), f"duplicate refId in {p['title']!r}"
        for t in targets:
            assert t.get("expr", "").strip(), f"empty expr in {p['title']!r}"
            assert t["datasource"]["uid"] == "${datasource}", p["title"]


def test_panels_do_not_overlap() -> None:
    cells: dict[tuple[int, int], str] = {}
    for p in dashboard_panels(load_dashboard()):
        g = p["gridPos"]
        assert g["x"] + g["w"] <= 24, p["title"]
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                assert (x, y) not in cells, f"{p['title']!r} overlaps {cells[(x, y)]!r}"
                cells[(x, y)] = p["title"]


def test_dashboard_covers_what_operators_need() -> None:
    exprs = [e for _, e in dashboard_exprs(load_dashboard())]
    used = set().union(*(metric_names(e) for e in exprs))
    required = {
        "batchq_jobs_succeeded_total", "batchq_jobs_failed_total", "batchq_jobs_retried_total",
        "batchq_jobs_dead_total", "batchq_jobs_started_total", "batchq_job_run_seconds",
        "batchq_job_wait_seconds", "batchq_queue_jobs", "batchq_queue_oldest_job_age_seconds",
        "batchq_queue_delayed_lag_seconds", "batchq_jobs_in_progress",
        "batchq_worker_concurrency", "batchq_worker_processes", "batchq_worker_restarts_total",
        "batchq_redis_seconds",
    }
    assert required <= used, f"not on the dashboard: {sorted(required - used)}"
    joined = "\n".join(exprs)
    for hist in ("batchq_job_run_seconds_bucket", "batchq_job_wait_seconds_bucket"):
        for q in ("0.5", "0.95", "0.99"):
            assert re.search(rf"histogram_quantile\({q},[^\n]*{hist}", joined), (q, hist)
    assert re.search(r"histogram_quantile\(0\.99, sum by \((le, op|op, le)\) "
                     r"\(rate\(batchq_redis_seconds_bucket", joined)
    assert "increase(batchq_jobs_dead_total" in joined
    flow = {"batchq_queue_grouped_jobs", "batchq_queue_groups", "batchq_queue_held_seconds",
            "batchq_limit_concurrency_used_ratio", "batchq_limit_rate_per_second",
            "batchq_group_waiting_seconds", "batchq_jobs_rate_limited_total"}
    assert flow <= used, f"flow control not on the dashboard: {sorted(flow - used)}"


def test_dashboard_metric_names_are_exported() -> None:
    for where, expr in dashboard_exprs(load_dashboard()):
        unknown = metric_names(expr) - EXPORTED
        assert not unknown, f"{where}: unknown metrics {sorted(unknown)} in {expr!r}"


def test_dashboard_filters_by_queue_wherever_it_applies() -> None:
    selector = re.compile(r"(batchq_[a-z_]+)(\{[^}]*\})?")
    for where, expr in dashboard_exprs(load_dashboard()):
        for m in selector.finditer(expr):
            if base_name(m.group(1)) in WITH_QUEUE_LABEL:
                assert 'queue=~"$queue"' in (m.group(2) or ""), \
                    f"{where}: {m.group(0)} is not filtered by $queue"


def test_histogram_quantiles_keep_le() -> None:
    for where, expr in dashboard_exprs(load_dashboard()):
        for m in re.finditer(r"histogram_quantile\(([^,]+),\s*sum by \(([^)]*)\)", expr):
            assert "le" in [x.strip() for x in m.group(2).split(",")], where
            assert 0 < float(m.group(1)) < 1, where


def test_grafana_provisioning() -> None:
    ds = load(GRAFANA / "provisioning" / "datasources" / "prometheus.yml")
    (source,) = ds["datasources"]
    assert source["type"] == "prometheus"
    assert source["url"] == "http://prometheus:9090"
    prov = load(GRAFANA / "provisioning" / "dashboards" / "batchq.yml")
    (provider,) = prov["providers"]
    assert provider["type"] == "file"
    assert provider["options"]["path"] == "/var/lib/grafana/dashboards"


# --- alert rules --------------------------------------------------------------------------

ALERT_NAMES = {"BatchqQueueBackingUp", "BatchqHighFailureRate", "BatchqDeadLettersGrowing",
               "BatchqNoWorkers", "BatchqWorkersRestarting", "BatchqRedisSlow",
               "BatchqPeriodicStalled", "BatchqGroupHeld", "BatchqQueueHeld"}


def test_alert_rules_shape() -> None:
    data = load(ALERTS)
    assert [g["name"] for g in data["groups"]] == ["batchq"]
    rules = {r["alert"]: r for r in load_alert_rules()}
    assert set(rules) == ALERT_NAMES
    for name, rule in rules.items():
        assert rule["labels"]["severity"] in ("warning", "critical"), name
        assert rule["annotations"]["summary"].strip(), name
        assert rule["annotations"]["description"].strip(), name
    assert rules["BatchqQueueBackingUp"]["for"] == "5m"
    assert "batchq_queue_oldest_job_age_seconds" in rules["BatchqQueueBackingUp"]["expr"]
    assert "> 300" in rules["BatchqQueueBackingUp"]["expr"]
    assert rules["BatchqRedisSlow"]["for"] == "10m"
    assert "> 0.05" in rules["BatchqRedisSlow"]["expr"]
    assert "> 0.10" in rules["BatchqHighFailureRate"]["expr"]
    assert "increase(batchq_jobs_dead_total[15m])" in rules["BatchqDeadLettersGrowing"]["expr"]
    assert "absent(batchq_worker_processes)" in rules["BatchqNoWorkers"]["expr"]
    assert "> 3" in rules["BatchqWorkersRestarting"]["expr"]
    stalled = rules["BatchqPeriodicStalled"]
    assert stalled["for"] == "2m"
    assert "time() - max by (task, queue) (batchq_periodic_next_run_timestamp_seconds) > 60" \
        in stalled["expr"]
    for name, metric, by in (("BatchqGroupHeld", "batchq_group_waiting_seconds",
                              "queue, group"),
                             ("BatchqQueueHeld", "batchq_queue_held_seconds", "queue")):
        assert rules[name]["for"] == "5m"
        assert f"max by ({by}) ({metric}) > 600" in rules[name]["expr"]


def test_alert_metric_names_are_exported() -> None:
    for rule in load_alert_rules():
        for field in (rule["expr"], *rule["annotations"].values()):
            unknown = metric_names(field) - EXPORTED
            assert not unknown, f"{rule['alert']}: unknown metrics {sorted(unknown)}"


def test_every_alert_has_promtool_cases() -> None:
    tests = load(GRAFANA / "alerts.test.yml")
    assert tests["rule_files"] == ["alerts.yml"]
    fired: set[str] = set()
    silent: set[str] = set()
    for case in tests["tests"]:
        for check in case.get("alert_rule_test", []):
            (fired if check.get("exp_alerts") else silent).add(check["alertname"])
    assert fired == ALERT_NAMES, f"no firing case: {sorted(ALERT_NAMES - fired)}"
    assert silent == ALERT_NAMES, f"no silent case: {sorted(ALERT_NAMES - silent)}"


# --- Dockerfile and entrypoint ------------------------------------------------------------


def dockerfile_instructions() -> list[tuple[str, str]]:
    text = (DEPLOY / "Dockerfile").read_text(encoding="utf-8")
    joined = re.sub(r"\\\n", " ", text)
    out = []
    for line in joined.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def test_dockerfile() -> None:
    ins = dockerfile_instructions()
    first = {}
    for word, rest in ins:
        first.setdefault(word, rest)
    assert first["FROM"] == "python:3.11-slim"
    users = [rest for word, rest in ins if word == "USER"]
    assert users, "no USER"
    final_user = users[-1].split(":")[0]
    assert final_user not in ("root", "0"), "the image must not run as root"
    stop = [rest for word, rest in ins if word == "STOPSIGNAL"]
    assert stop == ["SIGTERM"]
    (entry,) = [rest for word, rest in ins if word == "ENTRYPOINT"]
    argv = json.loads(entry)  # exec form is a JSON array
    assert isinstance(argv, list)
    assert argv[0].endswith("entrypoint") or argv[0].endswith("entrypoint.sh")
    copies = " ".join(rest for word, rest in ins if word == "COPY")
    assert f"deploy/entrypoint.sh {argv[0]}" in copies
    (health,) = [rest for word, rest in ins if word == "HEALTHCHECK"]
    cmd = health.split("CMD", 1)[1].strip()
    argv_h = json.loads(cmd) if cmd.startswith("[") else shlex.split(cmd)
    assert argv_h[:2] == ["batchq", "check"]
    assert "9808" in [rest for word, rest in ins if word == "EXPOSE"]
    env = " ".join(rest for word, rest in ins if word == "ENV")
    assert "BATCHQ_METRICS_ADDR=0.0.0.0" in env
    assert "PROMETHEUS_MULTIPROC_DIR=" in env
    assert any(word == "RUN" and "pip install ." in rest for word, rest in ins)


def test_dockerignore_keeps_what_the_image_copies() -> None:
    ignore = (DEPLOY / "Dockerfile.dockerignore").read_text(encoding="utf-8").split()
    for needed in ("!pyproject.toml", "!README.md", "!batchq/", "!deploy/entrypoint.sh"):
        assert needed in ignore


def test_entrypoint_static() -> None:
    path = DEPLOY / "entrypoint.sh"
    assert os.access(path, os.X_OK), "deploy/entrypoint.sh must be executable"
    text = path.read_text(encoding="utf-8")
    assert text.startswith("#!/bin/sh")
    assert 'exec batchq worker "$@"' in text
    assert "PROMETHEUS_MULTIPROC_DIR" in text


@pytest.mark.skipif(shutil.which("sh") is None, reason="no /bin/sh")
def test_entrypoint_wipes_the_metrics_dir_and_execs_the_worker(tmp_path: Path) -> None:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    fake = bindir / "batchq"
    fake.write_text('#!/bin/sh\necho "args:$*"\necho "dir:$PROMETHEUS_MULTIPROC_DIR"\n'
                    'ls -A "$PROMETHEUS_MULTIPROC_DIR" | sed "s/^/left:/"\n')
    fake.chmod(0o755)
    metrics_dir = tmp_path / "metrics"
    (metrics_dir / "sub").mkdir(parents=True)
    (metrics_dir / "counter_123.db").write_bytes(b"old")
    env = {"PATH": f"{bindir}:/usr/bin:/bin", "PROMETHEUS_MULTIPROC_DIR": str(metrics_dir)}
    out = subprocess.run(["sh", str(DEPLOY / "entrypoint.sh"), "app:app", "-p", "2"],
                         env=env, capture_output=True, text=True, timeout=10, check=True)
    lines = out.stdout.splitlines()
    assert lines == ["args:worker app:app -p 2", f"dir:{metrics_dir}"]
    # the default directory is created when missing
    new_dir = tmp_path / "fresh" / "metrics"
    env["PROMETHEUS_MULTIPROC_DIR"] = str(new_dir)
    subprocess.run(["sh", str(DEPLOY / "entrypoint.sh")], env=env, capture_output=True,
                   timeout=10, check=True)
    assert new_dir.is_dir()
    env["PROMETHEUS_MULTIPROC_DIR"] = "/"
    bad = subprocess.run(["sh", str(DEPLOY / "entrypoint.sh")], env=env, capture_output=True,
                         timeout=10, check=False)
    assert bad.returncode != 0


# --- compose ------------------------------------------------------------------------------


def compose() -> dict[str, Any]:
    data: dict[str, Any] = load(DEPLOY / "compose.yml")
    return data


def as_argv(command: str | list[str]) -> list[str]:
    return shlex.split(command) if isinstance(command, str) else [str(c) for c in command]


def env_dict(env: dict[str, Any] | list[str]) -> dict[str, str]:
    if isinstance(env, list):
        return dict(item.split("=", 1) for item in env)
    return {k: str(v) for k, v in env.items()}


def test_compose_redis_is_durable_and_never_evicts() -> None:
    redis = compose()["services"]["redis"]
    assert redis["image"].split(":")[0] == "redis"
    assert redis["image"].split(":")[1].startswith("7")
    argv = as_argv(redis["command"])
    opts = dict(zip(argv[1::2], argv[2::2], strict=False))
    assert argv[0] == "redis-server"
    assert opts["--appendonly"] == "yes"
    assert opts["--appendfsync"] == "everysec"
    assert opts["--maxmemory-policy"] == "noeviction"


def test_compose_worker_and_producer() -> None:
    services = compose()["services"]
    w = services["worker"]
    build = w["build"]
    context = (DEPLOY / build["context"]).resolve()
    assert context == REPO_ROOT
    assert (context / build["dockerfile"]).resolve() == DEPLOY / "Dockerfile"
    assert w["deploy"]["replicas"] == 2
    argv = as_argv(w["command"])
    assert "batchq.dev.demo:app" in argv
    assert "-p" in argv and int(argv[argv.index("-p") + 1]) >= 1
    env = env_dict(w["environment"])
    assert env["BATCHQ_REDIS_URL"] == "redis://redis:6379/0"
    assert seconds(w["stop_grace_period"]) > float(env["BATCHQ_SHUTDOWN_TIMEOUT"])
    assert "ports" not in w, "replicas cannot share a host port"

    p = services["producer"]
    cmd = as_argv(p.get("entrypoint", [])) + as_argv(p.get("command", []))
    assert cmd[:3] == ["python", "-m", "batchq.dev.demo"]
    assert cmd[cmd.index("--jobs") + 1] == "100000"
    assert env_dict(p["environment"])["BATCHQ_REDIS_URL"] == "redis://redis:6379/0"
    assert p["image"] == w["image"]


def test_compose_app_ref_is_importable() -> None:
    from batchq.cli import load_app

    argv = as_argv(compose()["services"]["worker"]["command"])
    (ref,) = [a for a in argv if ":" in a]
    assert load_app(ref).tasks, f"{ref} has no tasks"


def test_compose_bind_mounts_exist() -> None:
    for name, svc in compose()["services"].items():
        for vol in svc.get("volumes", []):
            src = vol.split(":")[0]
            if src.startswith("."):
                assert (DEPLOY / src).exists(), f"{name}: {src} does not exist"


def test_compose_prometheus_and_grafana() -> None:
    services = compose()["services"]
    prom = services["prometheus"]
    assert prom["image"].startswith("prom/prometheus")
    mounts = {v.split(":")[1]: v.split(":")[0] for v in prom["volumes"]}
    assert (DEPLOY / mounts["/etc/prometheus/alerts.yml"]).resolve() == ALERTS
    assert (DEPLOY / mounts["/etc/prometheus/prometheus.yml"]).resolve() == \
        DEPLOY / "prometheus.yml"
    config = load(DEPLOY / "prometheus.yml")
    assert "/etc/prometheus/alerts.yml" in config["rule_files"]
    targets = set()
    for job in config["scrape_configs"]:
        for sd in job.get("dns_sd_configs", []):
            targets |= {f"{n}:{sd['port']}" for n in sd["names"]}
        for sc in job.get("static_configs", []):
            targets |= set(sc["targets"])
    assert targets == {"worker:9808"}

    graf = services["grafana"]
    mounts = {v.split(":")[1]: v.split(":")[0] for v in graf["volumes"]}
    assert (DEPLOY / mounts["/etc/grafana/provisioning"]).resolve() == GRAFANA / "provisioning"
    assert (DEPLOY / mounts["/var/lib/grafana/dashboards"]).resolve() == DASHBOARD.parent


# --- Kubernetes ---------------------------------------------------------------------------


def docs_by_kind(path: Path) -> dict[str, dict[str, Any]]:
    return {d["kind"]: d for d in load_all(path)}


def worker_deployment() -> dict[str, Any]:
    return docs_by_kind(K8S_BASE / "deployment.yaml")["Deployment"]


def worker_container() -> dict[str, Any]:
    (c,) = worker_deployment()["spec"]["template"]["spec"]["containers"]
    return c


def test_kustomizations_reference_existing_files() -> None:
    base = load(K8S_BASE / "kustomization.yaml")
    for res in base["resources"]:
        assert (K8S_BASE / res).is_file(), res
    assert "secret.yaml" not in base["resources"], "the example Secret must not be applied"
    prod = load(K8S_PROD / "kustomization.yaml")
    for res in prod["resources"]:
        assert (K8S_PROD / res).exists(), res
    for patch in prod.get("patches", []):
        if "path" in patch:
            assert (K8S_PROD / patch["path"]).is_file(), patch["path"]


def test_deployment_grace_period_outlasts_the_drain() -> None:
    spec = worker_deployment()["spec"]["template"]["spec"]
    env = env_of(worker_container())
    assert float(env["BATCHQ_SHUTDOWN_TIMEOUT"]) == SHUTDOWN_TIMEOUT_S
    assert spec["terminationGracePeriodSeconds"] == 45
    assert spec["terminationGracePeriodSeconds"] > float(env["BATCHQ_SHUTDOWN_TIMEOUT"])


def test_deployment_probes_and_ports() -> None:
    c = worker_container()
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports["metrics"] == 9808

    def port_of(probe: dict[str, Any]) -> int:
        port = probe["httpGet"]["port"]
        return ports[port] if isinstance(port, str) else int(port)

    assert c["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert c["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert port_of(c["livenessProbe"]) == 9808
    assert port_of(c["readinessProbe"]) == 9808
    env = env_of(c)
    assert env["BATCHQ_METRICS_ADDR"] == "0.0.0.0"
    assert env.get("BATCHQ_METRICS_PORT", "9808") == "9808"
    assert env["BATCHQ_REDIS_URL"] == {"secretKeyRef": {"name": "batchq-redis", "key": "url"}}
    assert c["args"] and ":" in c["args"][0], "the first argument is the MODULE:APP"
    assert c["image"]


def test_deployment_resources_security_and_scrape_annotations() -> None:
    d = worker_deployment()
    pod = d["spec"]["template"]
    c = worker_container()
    assert c["resources"]["requests"]["cpu"]
    assert c["resources"]["requests"]["memory"]
    assert c["resources"]["limits"]["memory"]
    assert pod["spec"]["securityContext"]["runAsNonRoot"] is True
    assert pod["spec"]["securityContext"]["runAsUser"] != 0
    ann = pod["metadata"]["annotations"]
    assert ann["prometheus.io/scrape"] == "true"
    assert ann["prometheus.io/port"] == "9808"
    assert ann["prometheus.io/path"] == "/metrics"
    selector = d["spec"]["selector"]["matchLabels"]
    assert selector.items() <= pod["metadata"]["labels"].items()
    if c["securityContext"].get("readOnlyRootFilesystem"):
        mounts = {m["mountPath"] for m in c["volumeMounts"]}
        multiproc = env_of(c)["PROMETHEUS_MULTIPROC_DIR"]
        assert any(multiproc.startswith(m) for m in mounts), "multiproc dir must be writable"


def test_service_and_servicemonitor_select_the_workers() -> None:
    pod_labels = worker_deployment()["spec"]["template"]["metadata"]["labels"]
    svc = docs_by_kind(K8S_BASE / "service.yaml")["Service"]
    assert svc["spec"]["selector"].items() <= pod_labels.items()
    (port,) = svc["spec"]["ports"]
    assert port["name"] == "metrics"
    assert port["port"] == 9808
    sm = docs_by_kind(K8S_BASE / "servicemonitor.yaml")["ServiceMonitor"]
    assert sm["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    assert [e["port"] for e in sm["spec"]["endpoints"]] == ["metrics"]
    assert sm["spec"]["endpoints"][0]["path"] == "/metrics"


def test_example_secret_has_what_workers_and_keda_read() -> None:
    secret = docs_by_kind(K8S_BASE / "secret.yaml")["Secret"]
    assert secret["metadata"]["name"] == "batchq-redis"
    data = secret["stringData"]
    assert data["url"].startswith("redis://")
    keda = docs_by_kind(K8S_BASE / "keda-scaledobject.yaml")
    for ref in keda["TriggerAuthentication"]["spec"]["secretTargetRef"]:
        assert ref["name"] == "batchq-redis"
        assert ref["key"] in data


def test_keda_list_name_is_the_real_ready_list_key() -> None:
    docs = docs_by_kind(K8S_BASE / "keda-scaledobject.yaml")
    so = docs["ScaledObject"]
    assert so["spec"]["scaleTargetRef"]["name"] == worker_deployment()["metadata"]["name"]
    (trigger,) = so["spec"]["triggers"]
    assert trigger["type"] == "redis"
    expected = QueueKeys("batchq", "default").ready_for(0)
    assert trigger["metadata"]["listName"] == expected == "batchq:{batchq:default}:ready:0"
    assert int(trigger["metadata"]["listLength"]) > 0
    assert trigger["authenticationRef"]["name"] == docs["TriggerAuthentication"]["metadata"][
        "name"]
    assert so["spec"]["minReplicaCount"] <= so["spec"]["maxReplicaCount"]


def test_keda_prometheus_variant_in_comments_is_valid() -> None:
    lines = (K8S_BASE / "keda-scaledobject.yaml").read_text(encoding="utf-8").splitlines()
    comments = [re.sub(r"^\s*# ?", "", ln) for ln in lines if ln.strip().startswith("#")]
    start = next(i for i, ln in enumerate(comments) if ln.strip() == "- type: prometheus")
    block = []
    for ln in comments[start:]:
        if not ln.strip():
            break
        block.append(ln)
    (trigger,) = yaml.safe_load("\n".join(block))
    query = trigger["metadata"]["query"]
    assert "batchq_queue_oldest_job_age_seconds" in query
    assert metric_names(query) <= EXPORTED
    assert float(trigger["metadata"]["threshold"]) > 0
    assert trigger["metadata"]["serverAddress"].startswith("http")


def test_production_overlay() -> None:
    prod = load(K8S_PROD / "kustomization.yaml")
    name = worker_deployment()["metadata"]["name"]
    (rep,) = prod["replicas"]
    assert rep["name"] == name and rep["count"] >= 2
    # the overlay's replica count and KEDA's floor agree
    inline = [p for p in prod["patches"] if p.get("target", {}).get("kind") == "ScaledObject"]
    ops = {op["path"]: op["value"] for p in inline for op in yaml.safe_load(p["patch"])}
    assert ops["/spec/minReplicaCount"] == rep["count"]
    pdb = docs_by_kind(K8S_PROD / "pdb.yaml")["PodDisruptionBudget"]
    pod_labels = worker_deployment()["spec"]["template"]["metadata"]["labels"]
    assert pdb["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    assert "maxUnavailable" in pdb["spec"] or "minAvailable" in pdb["spec"]
    patch = docs_by_kind(K8S_PROD / "resources.yaml")["Deployment"]
    assert patch["metadata"]["name"] == name
    (c,) = patch["spec"]["template"]["spec"]["containers"]
    assert c["name"] == worker_container()["name"]
    assert c["resources"]["requests"] and c["resources"]["limits"]["memory"]


KUBECTL = shutil.which("kubectl")


@pytest.mark.skipif(KUBECTL is None, reason="kubectl not installed (renders the overlay)")
def test_production_overlay_renders() -> None:
    assert KUBECTL is not None
    out = subprocess.run([KUBECTL, "kustomize", str(K8S_PROD)], capture_output=True, text=True,
                         timeout=30, check=False)
    assert out.returncode == 0, out.stderr
    docs = [d for d in yaml.safe_load_all(out.stdout) if d]
    kinds = {d["kind"]: d for d in docs}
    assert {"Deployment", "Service", "ServiceMonitor", "ScaledObject", "TriggerAuthentication",
            "PodDisruptionBudget"} <= set(kinds)
    assert "Secret" not in kinds
    assert {d["metadata"].get("namespace") for d in docs} == {"batchq"}
    dep = kinds["Deployment"]
    assert dep["spec"]["replicas"] == kinds["ScaledObject"]["spec"]["minReplicaCount"]
    spec = dep["spec"]["template"]["spec"]
    (c,) = spec["containers"]
    env = env_of(c)
    assert spec["terminationGracePeriodSeconds"] > float(env["BATCHQ_SHUTDOWN_TIMEOUT"])
    assert env["BATCHQ_PROCESSES"] == "4"
    assert "BATCHQ_REDIS_URL" in env  # the strategic merge kept the base's env
    assert c["livenessProbe"]["httpGet"]["path"] == "/healthz"


def test_readme_mentions_every_piece() -> None:
    text = (DEPLOY / "README.md").read_text(encoding="utf-8")
    for name in ("Dockerfile", "entrypoint.sh", "compose.yml", "prometheus.yml",
                 "deployment.yaml", "service.yaml", "secret.yaml", "servicemonitor.yaml",
                 "keda-scaledobject.yaml", "overlays/production", "alerts.yml", "batchq.json"):
        assert name in text, name


def test_histogram_names_are_distinct_from_other_metrics() -> None:
    # base_name() may only strip suffixes of real histograms
    for name in EXPORTED - HISTOGRAMS:
        assert base_name(name) == name
