"""The chart's monitoring (monitoring.enabled): the ServiceMonitor over the worker's, the
watcher's and the console's /metrics, the PrometheusRule checked and unit-tested by the real
promtool (deploy/helm/relaunch/tests/rules_test.yaml), the PodDisruptionBudgets, and the values
schema that refuses unknown keys and bad values.

helm and kubectl come from scripts/install-deps.sh into .venv/bin, promtool from Debian's
`prometheus` package (the same script); without them these tests skip here and fail under CI."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry, generate_latest

from relaunch.console.metrics import AuditCollector
from relaunch.models.config import ClusterConfig
from tests.unit.test_deploy import CHART, ROOT, _helm, deployment, helm, kinds, render

__all__ = ["helm"]  # the fixture, imported for pytest

MONITORING = ("monitoring.enabled=true", "monitoring.consoleToken.existingSecret=relaunch-metrics")
ALERTS = (
    "RelaunchWatcherStale",
    "RelaunchWatcherPollSlow",
    "RelaunchWorkerScheduleToStartSlow",
    "RelaunchApprovalPastHalfExpiry",
    "RelaunchRecoveryFailed",
    "RelaunchGuardRefused",
    "RelaunchAuditWriteFailing",
    "RelaunchMetricsDown",
)
RULES_TEST = CHART / "tests" / "rules_test.yaml"
SCHEMA = CHART / "values.schema.json"
# Series the rules read that other parts of issue 31 add to the processes (obs: the watcher's
# and the worker's /metrics; data: the console's incremental counters). Once they are in the
# code, test_rules_read_series_the_project_exports checks them like the others.


@pytest.fixture(scope="module")
def promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        message = "promtool not installed (scripts/install-deps.sh installs Debian's prometheus)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return found


def _run(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, capture_output=True, text=True, timeout=120, cwd=cwd)


def rules_of(docs: list[dict[str, Any]]) -> dict[str, Any]:
    (rule,) = kinds(docs, "PrometheusRule")
    return dict(rule["spec"])


def alerts_of(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {r["alert"]: r for g in rules_of(docs)["groups"] for r in g["rules"]}


def write_rules(docs: list[dict[str, Any]], folder: Path) -> Path:
    path = folder / "rules.yaml"
    path.write_text(yaml.safe_dump(rules_of(docs), sort_keys=False))
    return path


def _labels_match(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    for expr in selector.get("matchExpressions", []):
        assert expr["operator"] == "In"
        if labels.get(expr["key"]) not in expr["values"]:
            return False
    match_labels: dict[str, str] = selector.get("matchLabels", {})
    return match_labels.items() <= labels.items()


# ---------------------------------------------------------------------- rendering


def test_monitoring_renders_a_service_monitor_over_every_process(helm: str) -> None:
    docs = render("ssh", *MONITORING, "monitoring.labels.release=kube-prometheus-stack")
    (monitor,) = kinds(docs, "ServiceMonitor")
    (rule,) = kinds(docs, "PrometheusRule")
    for selected_by_prometheus in (monitor, rule):
        assert selected_by_prometheus["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": ["relaunch"]}
    endpoints = {e["port"]: e for e in monitor["spec"]["endpoints"]}
    assert set(endpoints) == {"metrics", "http"}
    assert {e["path"] for e in endpoints.values()} == {"/metrics"}
    # The console's /metrics wants a viewer token: sent from a Secret, never inlined.
    assert endpoints["http"]["authorization"] == {
        "type": "Bearer",
        "credentials": {"name": "relaunch-metrics", "key": "token"},
    }
    # The worker's and watcher's series get their Service's cluster when they lack one.
    (relabel,) = endpoints["metrics"]["relabelings"]
    assert relabel == {
        "sourceLabels": ["__meta_kubernetes_service_label_relaunch_io_cluster"],
        "targetLabel": "cluster",
    }
    selected = {
        s["metadata"]["labels"]["app.kubernetes.io/component"]: s
        for s in kinds(docs, "Service")
        if _labels_match(monitor["spec"]["selector"], s["metadata"]["labels"])
    }
    assert set(selected) == {"worker", "watcher", "console"}
    for component, port in (("worker", 9464), ("watcher", 9410)):
        service = selected[component]
        assert service["metadata"]["labels"]["relaunch.io/cluster"] == "gpu-a"
        assert service["spec"]["clusterIP"] == "None"
        assert service["spec"]["publishNotReadyAddresses"] is True
        assert service["spec"]["ports"] == [
            {"name": "metrics", "port": port, "targetPort": "metrics", "protocol": "TCP"}
        ]
        pod = deployment(docs, component)["spec"]["template"]
        assert service["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
        (container,) = pod["spec"]["containers"]
        assert container["ports"] == [{"name": "metrics", "containerPort": port, "protocol": "TCP"}]
    assert [p["name"] for p in selected["console"]["spec"]["ports"]] == ["http"]
    # The processes listen where the Services point: the configuration's `metrics` section.
    raw, _ = configs(docs)
    assert raw["metrics"] == {"watch_address": "0.0.0.0:9410", "worker_address": "0.0.0.0:9464"}
    # Prometheus may reach the metrics port through the NetworkPolicy values-ssh.yaml enables.
    (no_ingress,) = [
        n for n in kinds(docs, "NetworkPolicy") if n["metadata"]["name"].endswith("no-ingress")
    ]
    assert no_ingress["spec"]["ingress"] == [{"ports": [{"port": "metrics", "protocol": "TCP"}]}]


def configs(docs: list[dict[str, Any]]) -> tuple[dict[str, Any], ClusterConfig | None]:
    """The rendered configuration, and as ClusterConfig reads it where ClusterConfig knows a
    `metrics` section (the processes' /metrics, issue 31's obs part: until it is merged, the
    raw section is all that can be checked)."""
    (cm,) = kinds(docs, "ConfigMap")
    raw = json.loads(cm["data"]["cluster.json"])
    if "metrics" in raw and "metrics" not in ClusterConfig.model_fields:
        return raw, None
    return raw, ClusterConfig.model_validate(raw)


def test_monitoring_off_renders_none_of_it(helm: str) -> None:
    docs = render("ssh")
    assert not kinds(docs, "ServiceMonitor") and not kinds(docs, "PrometheusRule")
    assert [s["metadata"]["name"] for s in kinds(docs, "Service")] == ["rel-relaunch-console"]
    for component in ("worker", "watcher"):
        (container,) = deployment(docs, component)["spec"]["template"]["spec"]["containers"]
        assert "ports" not in container
    raw, config = configs(docs)
    assert "metrics" not in raw and config is not None  # the processes' default: off


def test_each_worker_process_is_scraped(helm: str) -> None:
    """With worker.processes N, process i serves on port + i - 1: each has a named port on the
    pod and the Service, an endpoint in the ServiceMonitor, and a way in through the
    NetworkPolicy."""
    docs = render("ssh", *MONITORING, "worker.processes=3")
    want = [("metrics", 9464), ("metrics-2", 9465), ("metrics-3", 9466)]
    (container,) = deployment(docs, "worker")["spec"]["template"]["spec"]["containers"]
    assert [(p["name"], p["containerPort"]) for p in container["ports"]] == want
    services = {s["metadata"]["name"]: s for s in kinds(docs, "Service")}
    ports = services["rel-relaunch-worker"]["spec"]["ports"]
    assert [(p["name"], p["port"], p["targetPort"]) for p in ports] == [
        (name, port, name) for name, port in want
    ]
    assert [p["name"] for p in services["rel-relaunch-watcher"]["spec"]["ports"]] == ["metrics"]
    (monitor,) = kinds(docs, "ServiceMonitor")
    scraped = [e["port"] for e in monitor["spec"]["endpoints"]]
    assert scraped == ["metrics", "metrics-2", "metrics-3", "http"]
    (no_ingress,) = [
        n for n in kinds(docs, "NetworkPolicy") if n["metadata"]["name"].endswith("no-ingress")
    ]
    assert [p["port"] for p in no_ingress["spec"]["ingress"][0]["ports"]] == scraped[:3]
    sets = [*MONITORING, "monitoring.ports.worker=65534", "worker.processes=3"]
    result = _helm(
        "template",
        "rel",
        str(CHART),
        "-f",
        str(CHART / "values-ssh.yaml"),
        *[a for item in sets for a in ("--set", item)],
    )
    assert result.returncode != 0
    assert "worker process 3 of gpu-a would serve metrics on port 65536" in result.stderr


def test_the_rule_has_every_alert_scoped_to_the_release(helm: str) -> None:
    alerts = alerts_of(render("ssh", *MONITORING))
    assert tuple(alerts) == ALERTS
    for name, rule in alerts.items():
        assert rule["labels"]["severity"] in {"critical", "warning"}
        assert f"docs/alerts.md#{name.lower()}" in rule["annotations"]["description"]
        if name != "RelaunchMetricsDown":
            assert "cluster=~`gpu-a`" in rule["expr"], name
    assert 'namespace="relaunch"' in alerts["RelaunchMetricsDown"]["expr"]
    # The SDK's histogram name is one value (and its unit another): the integrator's to change.
    changed = alerts_of(
        render(
            "ssh",
            *MONITORING,
            "monitoring.rules.scheduleToStart.metric=temporal_activity_schedule_to_start_latency_seconds",
            "monitoring.rules.recoveriesFailed.enabled=false",
        )
    )
    assert "RelaunchRecoveryFailed" not in changed
    expr = changed["RelaunchWorkerScheduleToStartSlow"]["expr"]
    assert "temporal_activity_schedule_to_start_latency_seconds_bucket{" in expr
    assert expr.strip().endswith("> 30")
    default = alerts["RelaunchWorkerScheduleToStartSlow"]["expr"]
    assert "temporal_activity_schedule_to_start_latency_bucket{" in default
    assert default.strip().endswith("> 30")  # the worker exports durations as seconds
    in_ms = alerts_of(
        render("ssh", *MONITORING, "monitoring.rules.scheduleToStart.unit=milliseconds")
    )
    assert in_ms["RelaunchWorkerScheduleToStartSlow"]["expr"].strip().endswith("> 30000")


def test_the_console_needs_a_token_to_be_scraped(helm: str) -> None:
    args = ["template", "rel", str(CHART), "-f", str(CHART / "values-ssh.yaml")]
    result = _helm(*args, "--set", "monitoring.enabled=true")
    assert result.returncode != 0
    assert "monitoring.consoleToken.existingSecret is required" in result.stderr
    docs = render("ssh", "monitoring.enabled=true", "console.enabled=false")
    (monitor,) = kinds(docs, "ServiceMonitor")
    assert [e["port"] for e in monitor["spec"]["endpoints"]] == ["metrics"]


# ---------------------------------------------------------------------- promtool


def test_rules_pass_promtool_check_and_unit_tests(helm: str, promtool: str, tmp_path: Path) -> None:
    rules = write_rules(render("ssh", *MONITORING), tmp_path)
    check = _run(promtool, "check", "rules", str(rules))
    assert check.returncode == 0, check.stdout + check.stderr
    assert f"SUCCESS: {len(ALERTS)} rules found" in check.stdout
    shutil.copy(RULES_TEST, tmp_path / RULES_TEST.name)
    tested = _run(promtool, "test", "rules", RULES_TEST.name, cwd=tmp_path)
    assert tested.returncode == 0, tested.stdout + tested.stderr
    # Every alert is shown firing and shown quiet when healthy.
    spec = yaml.safe_load(RULES_TEST.read_text())
    cases = [c for t in spec["tests"] for c in t["alert_rule_test"]]
    assert {c["alertname"] for c in cases if c["exp_alerts"]} == set(ALERTS)
    (healthy,) = [t for t in spec["tests"] if t["name"] == "healthy"]
    assert {c["alertname"] for c in healthy["alert_rule_test"] if not c["exp_alerts"]} == set(
        ALERTS
    )


def test_a_stricter_threshold_makes_the_unit_tests_fail(
    helm: str, promtool: str, tmp_path: Path
) -> None:
    """The unit tests read the rendered thresholds: with the stale threshold at 10 minutes the
    stale watcher of rules_test.yaml no longer fires at 14m."""
    write_rules(render("ssh", *MONITORING, "monitoring.rules.watcherStale.seconds=600"), tmp_path)
    shutil.copy(RULES_TEST, tmp_path / RULES_TEST.name)
    tested = _run(promtool, "test", "rules", RULES_TEST.name, cwd=tmp_path)
    assert tested.returncode != 0
    assert "alertname: RelaunchWatcherStale, time: 14m" in tested.stdout + tested.stderr


def test_a_release_of_two_clusters_sees_each_watcher_go(
    helm: str, promtool: str, tmp_path: Path
) -> None:
    """One release for prod and research: research's watcher exports nothing while prod's is
    healthy, and RelaunchWatcherStale fires for research alone."""
    write_rules(render("two-clusters", *MONITORING), tmp_path)
    series = "relaunch_watch_last_good_poll_timestamp_seconds"
    watcher = 'job="rel-relaunch-prod-watcher",namespace="relaunch",instance="10.0.2.7:9410"'
    stale = {
        "rule_files": ["rules.yaml"],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": [
                    {"series": f'{series}{{cluster="prod",{watcher}}}', "values": "0+60x10"},
                ],
                "alert_rule_test": [
                    {
                        "eval_time": "5m",
                        "alertname": "RelaunchWatcherStale",
                        "exp_alerts": [
                            {
                                "exp_labels": {"severity": "critical", "cluster": "research"},
                                "exp_annotations": {
                                    "summary": (
                                        "Cluster research: no good watcher poll for over 60s"
                                    ),
                                    "description": (
                                        "The watcher of cluster research has not polled Slurm"
                                        " successfully for over 60 s, or exports nothing:"
                                        " interruptions are not being detected."
                                        " docs/alerts.md#relaunchwatcherstale"
                                    ),
                                },
                            }
                        ],
                    }
                ],
            }
        ],
    }
    (tmp_path / "two.yaml").write_text(yaml.safe_dump(stale))
    tested = _run(promtool, "test", "rules", "two.yaml", cwd=tmp_path)
    assert tested.returncode == 0, tested.stdout + tested.stderr
    jobs = alerts_of(render("two-clusters", *MONITORING))["RelaunchMetricsDown"]["expr"]
    for job in ("prod-worker", "prod-watcher", "research-worker", "research-watcher", "console"):
        assert f"rel-relaunch-{job}" in jobs


def test_rules_read_series_the_project_exports(helm: str) -> None:
    """Each series a rule reads is exported under that name: the console's from the code
    (relaunch_guard_refusals is a counter, so prometheus_client serves it with _total), the
    others where their exporter lives."""
    text = json.dumps(rules_of(render("ssh", *MONITORING)))
    names = set(re.findall(r"\b(relaunch_[a-z_]+)\{", text))
    assert names == {
        "relaunch_watch_last_good_poll_timestamp_seconds",
        "relaunch_watch_poll_duration_seconds_bucket",
        "relaunch_approvals_waiting_past_half_expiry",
        "relaunch_recoveries_failed_total",
        "relaunch_guard_refusals_total",
        "relaunch_worker_audit_write_failures_total",
    }
    registry = CollectorRegistry(auto_describe=False)
    refusals = [{"guard": "blast_radius", "n": 2}]
    empty = {"detections": [], "latency": [0, 0] + [0] * 11, "to_action": [0, 0] + [0] * 11}
    registry.register(
        AuditCollector({"gpu-a": {**empty, "actions": [], "pending": 0, "refusals": refusals}})
    )
    exported = generate_latest(registry).decode()
    assert 'relaunch_guard_refusals_total{cluster="gpu-a",guard="blast_radius"} 2.0' in exported
    source = "\n".join(p.read_text() for p in (ROOT / "relaunch").rglob("*.py"))
    for name in names - {"relaunch_guard_refusals_total"}:
        base = re.sub(r"_(bucket|total)$", "", name)
        exported_here = re.search(rf"[\"']{base}(_total)?[\"']", source) is not None
        assert exported_here, name


# ---------------------------------------------------------------------- disruption budgets


def test_budgets_for_console_and_workers_of_several_pods_never_the_watcher(helm: str) -> None:
    docs = render("ssh", *MONITORING)  # two consoles, two workers
    budgets = {
        b["metadata"]["labels"]["app.kubernetes.io/component"]: b
        for b in kinds(docs, "PodDisruptionBudget")
    }
    assert set(budgets) == {"console", "worker"}
    for component, budget in budgets.items():
        assert budget["spec"]["maxUnavailable"] == 1
        pod = deployment(docs, component)["spec"]["template"]["metadata"]["labels"]
        assert budget["spec"]["selector"]["matchLabels"].items() <= pod.items()
        watcher = deployment(docs, "watcher")["spec"]["template"]["metadata"]["labels"]
        assert not budget["spec"]["selector"]["matchLabels"].items() <= watcher.items()
    # One pod each: no budget (it would block a node drain or allow it anyway).
    assert not kinds(render("incluster"), "PodDisruptionBudget")
    assert not kinds(render("ssh", "podDisruptionBudget.enabled=false"), "PodDisruptionBudget")
    two = kinds(render("two-clusters"), "PodDisruptionBudget")
    assert sorted(b["metadata"]["name"] for b in two) == [
        "rel-relaunch-console",
        "rel-relaunch-prod-worker",
    ]


# ---------------------------------------------------------------------- values schema


def _lint(tmp_path: Path, values: dict[str, Any], *sets: str) -> subprocess.CompletedProcess[str]:
    extra = tmp_path / "extra.yaml"
    extra.write_text(yaml.safe_dump(values))
    args = ["lint", "--strict", str(CHART), "-f", str(CHART / "values-ssh.yaml"), "-f", str(extra)]
    for item in sets:
        args += ["--set", item]
    return _helm(*args)


def test_an_unknown_key_fails_lint(helm: str, tmp_path: Path) -> None:
    assert _lint(tmp_path, {}).returncode == 0
    result = _lint(tmp_path, {"imag": {"tag": "0.2.0"}})
    assert result.returncode != 0
    assert "additional properties 'imag' not allowed" in result.stdout + result.stderr


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"monitoring": {"enabled": True, "intervall": "30s"}}, "'intervall' not allowed"),
        ({"monitoring": {"rules": {"watcherStale": {"sevrity": "page"}}}}, "'sevrity' not allowed"),
        ({"database": {"migrate": {"enabld": False}}}, "'enabld' not allowed"),
        ({"worker": {"livenessProbe": {"periodSecond": 10}}}, "'periodSecond' not allowed"),
        ({"clusters": [{"name": "prod", "imag": "x"}]}, "'imag' not allowed"),
        ({"monitoring": {"ports": {"worker": 70000}}}, "maximum: got 70,000, want 65,535"),
        ({"monitoring": {"interval": 30}}, "got number, want string"),
        ({"monitoring": {"interval": "30 seconds"}}, "does not match pattern"),
        ({"monitoring": {"rules": {"pollSlow": {"quantile": 1.5}}}}, "exclusiveMaximum"),
        ({"monitoring": {"rules": {"scheduleToStart": {"unit": "minutes"}}}}, "must be one of"),
        ({"database": {"migrate": {"enabled": "yes"}}}, "got string, want boolean"),
        ({"database": {"migrate": {"backoffLimit": -1}}}, "minimum: got -1, want 0"),
        ({"console": {"service": {"type": "Ingress"}}}, "must be one of"),
        ({"worker": {"replicas": 0}}, "minimum: got 0, want 1"),
        ({"podDisruptionBudget": {"maxUnavailable": 0}}, "minimum: got 0, want 1"),
    ],
)
def test_bad_values_fail_lint_naming_the_key(
    helm: str, tmp_path: Path, values: dict[str, Any], message: str
) -> None:
    result = _lint(tmp_path, values)
    out = result.stdout + result.stderr
    assert result.returncode != 0 and message in out, out


def _schema_at(schema: dict[str, Any], path: list[str]) -> dict[str, Any] | None:
    node = schema
    for key in path:
        while "$ref" in node:
            node = schema["definitions"][node["$ref"].rsplit("/", 1)[1]]
        if node.get("type") != "object" or "properties" not in node:
            return node  # an open object (a Kubernetes type, a configuration section)
        if key not in node["properties"]:
            return None
        node = node["properties"][key]
    return node


def _leaves(values: Any, path: list[str]) -> list[list[str]]:
    if isinstance(values, dict) and values:
        return [p for k, v in values.items() for p in _leaves(v, [*path, k])]
    return [path]


def test_the_schema_allows_every_key_of_values_and_templates(helm: str) -> None:
    schema = json.loads(SCHEMA.read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    used = set()
    for template in (CHART / "templates").iterdir():
        used |= set(re.findall(r"\.Values((?:\.[A-Za-z][A-Za-z0-9_]*)+)", template.read_text()))
    paths = _leaves(values, []) + [u.lstrip(".").split(".") for u in used]
    assert ["database", "migrate", "enabled"] in paths
    missing = [".".join(p) for p in paths if _schema_at(schema, p) is None]
    assert not missing, f"values the schema refuses: {missing}"
