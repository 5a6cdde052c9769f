"""A local stack of several clusters (`relaunch dev up --clusters a,b`): where each cluster
lives, its ports, its configuration and the console's tokens; and the CLI's refusal of an
incident of another cluster. The real two-cluster run is tests/integration/test_clusters.py."""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from relaunch.cli.incidents import OtherClusterError, refuse_other_cluster
from relaunch.cli.main import cli
from relaunch.console.auth import TokenStore
from relaunch.devstack import stack as stack_module
from relaunch.devstack.stack import Stack, StackConfig
from relaunch.models.config import ClusterConfig
from relaunch.models.errors import RelaunchError, StackError


def test_each_further_cluster_has_its_own_slurm_ports_and_folders(tmp_path: Path) -> None:
    stack = Stack(tmp_path / "state", StackConfig.for_clusters(["a", "b", "c"]))
    a, b, c = stack.clusters
    assert [h.name for h in stack.clusters] == ["a", "b", "c"] == stack.config.clusters
    assert stack.slurm is a.slurm and a.root == stack.state_dir  # the first: as one cluster
    assert b.root == stack.state_dir / "cluster-b"
    assert (a.slurm.slurmctld_port, b.slurm.slurmctld_port, c.slurm.slurmctld_port) == (
        16817,
        17017,
        17217,
    )
    ports = [p for h in stack.clusters for p in (h.slurm.slurmctld_port, h.slurm.restd_port)]
    ports += [p for h in stack.clusters for p in h.slurm.slurmd_ports]
    assert len(ports) == len(set(ports))  # no port shared between clusters
    assert {h.slurm.nodes[1] for h in stack.clusters} == {"n2"}  # the same node names
    assert b.slurm.conf == stack.state_dir / "cluster-b" / "slurm" / "slurm.conf"
    assert b.slurm.munge_key != a.slurm.munge_key  # each cluster its own munge key
    assert stack.node_log("n2", "b") == stack.state_dir / "cluster-b" / "nodes" / "n2" / "kern.log"
    with pytest.raises(StackError, match="no cluster 'z'"):
        stack.home("z")


def test_each_cluster_has_its_own_configuration_sharing_temporal_and_postgres(
    tmp_path: Path,
) -> None:
    stack = Stack(tmp_path / "state", StackConfig.with_free_ports("b", cluster="a"))
    a, b = (stack.cluster_config(name) for name in ("a", "b"))
    assert (a.name, b.name) == ("a", "b")
    assert a.slurm_conf != b.slurm_conf and a.bundle_dir != b.bundle_dir
    assert a.node_log_pattern != b.node_log_pattern
    assert (a.temporal_address, a.database_url) == (b.temporal_address, b.database_url)
    # Saved, reloaded: the same clusters on the same ports.
    stack.state_dir.mkdir(parents=True)
    (stack.state_dir / "stack.json").write_text(stack.config.model_dump_json())
    again = Stack(tmp_path / "state")
    assert [h.slurm for h in again.clusters] == [h.slurm for h in stack.clusters]


def test_console_tokens_hold_an_approver_limited_to_each_cluster(tmp_path: Path) -> None:
    stack = Stack(tmp_path / "state", StackConfig.for_clusters(["a", "b"]))
    stack.write_console_tokens()
    lines = [
        line.split()
        for line in stack.console_tokens.read_text().splitlines()
        if not line.startswith("#")
    ]
    by_name = {fields[0]: fields for fields in lines}
    assert set(by_name) == {"viewer", "approver", "admin", "approver-a", "approver-b"}
    assert by_name["approver-a"][1:2] == ["approver"] and by_name["approver-a"][3:] == ["a"]
    assert len(by_name["admin"]) == 3  # every cluster
    store = TokenStore(stack.console_dir / "tokens.json")
    user = store.authenticate(by_name["approver-a"][2])
    assert user is not None and user.sees("a") and not user.sees("b")
    admin = store.authenticate(by_name["admin"][2])
    assert admin is not None and admin.sees("a") and admin.sees("b")


def test_one_cluster_keeps_todays_tokens(tmp_path: Path) -> None:
    stack = Stack(tmp_path / "state", StackConfig())
    stack.write_console_tokens()
    entries = json.loads((stack.console_dir / "tokens.json").read_text())
    assert [e["name"] for e in entries] == ["viewer", "approver", "admin"]
    assert all("clusters" not in e for e in entries)


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("a,a", "a cluster is named twice"),
        ("a,b;rm", "invalid cluster name 'b;rm'"),
        ("a,b,c,d,e", "at most 4 clusters"),
        (",", "name at least one cluster"),
    ],
)
def test_dev_up_refuses_bad_cluster_lists(tmp_path: Path, value: str, says: str) -> None:
    result = CliRunner().invoke(
        cli, ["dev", "up", "--state-dir", str(tmp_path / "s"), "--clusters", value]
    )
    assert result.exit_code == 2 and says in result.output, result.output
    assert not (tmp_path / "s").exists()  # refused before anything started


class Audit:
    """The audit trail's `incident_info`: the clusters of the incidents it knows, or down."""

    def __init__(self, known: dict[str, str] | None) -> None:
        self.known = known

    async def incident_info(self, incident_id: str) -> dict[str, object] | None:
        if self.known is None:
            raise RelaunchError("the audit database does not answer")
        cluster = self.known.get(incident_id)
        return {"cluster": cluster, "job_id": "12", "attempt": 0} if cluster else None


def refuse(cluster: str, incident: str, known: dict[str, str] | None = None) -> None:
    config = ClusterConfig(name=cluster, database_url="postgresql:///unused", bundle_dir="/x")
    asyncio.run(refuse_other_cluster(config, incident, Audit(known)))  # type: ignore[arg-type]


def test_the_cli_refuses_an_incident_of_another_cluster() -> None:
    refuse("a", "relaunch-a-12-0")  # its own: no refusal
    refuse("a", "relaunch-a-node-n2-1")
    with pytest.raises(OtherClusterError, match="is of cluster b, not of cluster a") as refused:
        refuse("a", "relaunch-b-12-0")
    assert refused.value.hint == "pass --cluster b (or its --config) to act on it"
    with pytest.raises(OtherClusterError, match="not an incident of cluster a"):
        refuse("a", "intake-b")


def test_the_audit_trail_says_whose_an_incident_is() -> None:
    """Cluster names may hold dashes: `relaunch-a-b-12-0` looks like a's by its id, but the
    audit trail records it as cluster a-b's. With the trail down, the id alone decides."""
    with pytest.raises(OtherClusterError, match="is of cluster a-b, not of cluster a"):
        refuse("a", "relaunch-a-b-12-0", {"relaunch-a-b-12-0": "a-b"})
    refuse("a-b", "relaunch-a-b-12-0", {"relaunch-a-b-12-0": "a-b"})
    refuse("a", "relaunch-a-b-12-0", None)
    with pytest.raises(OtherClusterError, match="is of cluster b"):
        refuse("a", "relaunch-b-12-0", None)


def test_up_waits_for_each_service_to_work_and_says_which_exited(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`up` returns once every worker and watcher has logged that it works (a fault injected
    before a watcher's first look would go unseen); one that exits at start fails `up` at once,
    naming it and its log. Here each service is a shell that says what the real one says."""
    stack = Stack(tmp_path / "state", StackConfig.for_clusters(["a", "b"]))
    spawned: list[subprocess.Popen[bytes]] = []
    says = {"worker": "worker for cluster", "watch": "watching cluster"}
    failing: set[str] = set()

    def spawn(argv: list[str], *, log: Path, env: object = None, cwd: object = None) -> int:
        service, cluster = argv[3], Path(argv[5]).stem
        script = (
            "exit 3"
            if f"{service} {cluster}" in failing
            else (f"sleep 0.5; echo '{says.get(service, '')} {cluster}'; sleep 30")
        )
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "ab") as out:
            spawned.append(subprocess.Popen(["sh", "-c", script], stdout=out))
        return spawned[-1].pid

    monkeypatch.setattr(stack_module.procs, "spawn", spawn)
    monkeypatch.setattr(stack_module.procs, "port_open", lambda port: True)  # the console
    lines: list[str] = []
    try:
        started = time.monotonic()
        stack._start_services(lines.append)
        assert time.monotonic() - started >= 0.5  # it waited for them to say so
        assert lines[-1] == "waiting for the relaunch services to work"
        for home in stack.clusters:
            for service in ("worker", "watch"):
                assert f"{says[service]} {home.name}" in home.log_file(service).read_text()
        for proc in spawned:
            proc.kill()
            proc.wait()
        failing.add("watch b")
        with pytest.raises(StackError, match="relaunch watch exited at start") as failed:
            stack._start_services(lines.append)
        assert str(stack.home("b").log_file("watch")) in (failed.value.hint or "")
    finally:
        for proc in spawned:
            proc.kill()
            proc.wait()
