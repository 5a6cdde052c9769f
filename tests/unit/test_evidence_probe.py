"""The evidence step's own probe of a job's nodes: a fresh read of what the watcher's probe saw,
on real sockets. A node counts as unreachable only when no probe gets an answer; a prober that
cannot probe at all makes nobody unreachable."""

from __future__ import annotations

import socket
from collections.abc import Iterator, Sequence
from typing import cast

import pytest

from relaunch.activities.deps import Deps
from relaunch.activities.evidence import EvidenceActivities
from relaunch.connectors.audit import AuditStore
from relaunch.connectors.liveness import ProbeError, Prober, ProbeResult, ProbeTarget
from relaunch.connectors.slurm.commands import SlurmCli
from relaunch.models.config import ClusterConfig, ProbeMethod
from relaunch.models.scheduler import Node


class Broken:
    """A prober whose every round fails before a probe is sent (an SSH host that is down)."""

    method = "ssh"

    async def probe(self, targets: Sequence[ProbeTarget], timeout_s: float) -> list[ProbeResult]:
        raise ProbeError("the probe host does not answer")

    async def close(self) -> None:
        return None


class Cluster(SlurmCli):
    def __init__(self, prober: Prober | None = None) -> None:
        super().__init__()
        self.made: list[str] = []
        self._fixed = prober

    def prober(self, method: str = "auto") -> Prober:
        self.made.append(method)
        if self._fixed is not None:
            return self._fixed
        if method == "syn":
            raise ProbeError("SYN probes need a raw socket, which this process may not open")
        return super().prober(method)


@pytest.fixture
def listener() -> Iterator[int]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(8)
        yield s.getsockname()[1]


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def activities(cluster: Cluster, method: str = "connect") -> EvidenceActivities:
    config = ClusterConfig(name="dev", database_url="postgresql://x", bundle_dir="/tmp")
    config.watch.probe_method = ProbeMethod(method)
    return EvidenceActivities(Deps(config=config, scheduler=cluster, audit=cast(AuditStore, None)))


async def test_only_the_node_that_answers_no_probe_is_unreachable(listener: int) -> None:
    nodes = [
        Node(name="n1", address="127.0.0.1", port=listener),
        Node(name="n2", address="127.0.0.1", port=closed_port()),
        Node(name="n3"),  # Slurm gave no address: not probed, not convicted
    ]
    assert await activities(Cluster())._unreachable(nodes) == ["n2"]


async def test_a_prober_this_process_may_not_have_falls_back_to_connect(listener: int) -> None:
    cluster = Cluster()
    nodes = [Node(name="n2", address="127.0.0.1", port=closed_port())]
    assert await activities(cluster, "syn")._unreachable(nodes) == ["n2"]
    assert cluster.made == ["syn", "connect"]


async def test_a_prober_that_cannot_probe_makes_nobody_unreachable() -> None:
    nodes = [Node(name="n2", address="127.0.0.1", port=closed_port())]
    assert await activities(Cluster(Broken()))._unreachable(nodes) == []
