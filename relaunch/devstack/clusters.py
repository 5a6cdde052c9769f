"""The clusters of a local stack (`relaunch dev up --clusters a,b`).

A stack runs one Temporal dev server, one PostgreSQL and one console, shared by every cluster
it holds, as a site shares them (the design's "a worker deployment per cluster"). Each cluster
has its own Slurm (munged with its own key, slurmctld, slurmds, slurmrestd, on ports of its
own), its own node logs and bundles, and its own Relaunch worker and watcher on its own task
queue. The first cluster lives at the top of the state directory, as a stack of one cluster
always has; each further one under ``cluster-<name>/``, with the same layout inside.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, field_validator

from relaunch.devstack import procs
from relaunch.devstack.slurm import SlurmLayout
from relaunch.models.names import cluster_name

# The cluster's own Relaunch services (the console is the stack's, one for all clusters).
CLUSTER_SERVICES = ("worker", "watch")
# Further clusters on the default ports: the first cluster's, shifted by this much per cluster.
PORT_STRIDE = 200


class MoreCluster(BaseModel):
    """A cluster of the stack after the first: its name and its Slurm's ports."""

    name: str
    slurmctld_port: int
    slurmd_base_port: int
    restd_port: int

    @field_validator("name")
    @classmethod
    def _safe_name(cls, value: str) -> str:
        return cluster_name(value)

    @classmethod
    def at_offset(
        cls, name: str, index: int, slurmctld_port: int, slurmd_base_port: int, restd_port: int
    ) -> MoreCluster:
        """The ``index``-th further cluster on the first cluster's ports, shifted."""
        shift = PORT_STRIDE * index
        return cls(
            name=name,
            slurmctld_port=slurmctld_port + shift,
            slurmd_base_port=slurmd_base_port + shift,
            restd_port=restd_port + shift,
        )

    @classmethod
    def on_free_ports(cls, name: str, nodes: int) -> MoreCluster:
        return cls(
            name=name,
            slurmctld_port=procs.free_port(),
            slurmd_base_port=free_port_block(nodes),
            restd_port=procs.free_port(),
        )


def free_port_block(count: int) -> int:
    """The first of ``count`` consecutive ports nothing listens on (a cluster's slurmds)."""
    base = procs.free_port()
    while any(procs.port_open(base + i) for i in range(count)) or base + count > 32000:
        base = procs.free_port()
    return base


class ClusterHome:
    """Where one cluster of the stack keeps its Slurm, its node logs, its bundles and its
    worker's and watcher's pid and log files; ``state_dir`` is the stack's."""

    def __init__(self, state_dir: Path, root: Path, slurm: SlurmLayout) -> None:
        self.state_dir = state_dir
        self.root = root
        self.slurm = slurm

    @property
    def name(self) -> str:
        return self.slurm.cluster

    @property
    def config_path(self) -> Path:
        """The cluster's Relaunch configuration (every cluster's in one folder)."""
        return self.state_dir / "clusters" / f"{self.name}.json"

    def node_log(self, node: str) -> Path:
        """The node's kernel-log source (the dev cluster's stand-in for /var/log/kern.log)."""
        return self.root / "nodes" / node / "kern.log"

    def telemetry_pattern(self) -> str:
        return str(self.root / "nodes" / "{node}" / "telemetry.jsonl")

    @property
    def bundle_dir(self) -> Path:
        return self.root / "bundles"

    def pid_file(self, service: str) -> Path:
        return self.root / "run" / f"{service}.pid"

    def log_file(self, service: str) -> Path:
        return self.root / "log" / f"{service}.log"

    def service_pid(self, service: str) -> int | None:
        pid = procs.read_pid(self.pid_file(service))
        return pid if procs.pid_alive(pid) else None
