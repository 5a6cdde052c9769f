"""Issue 29 row 7: a probe timeout alone never convicts a node.

A job can fill another node's slurmd listen backlog with idle connections; the node's kernel
then drops every new SYN, and Relaunch's probes time out as on a dead node. Here the backlog is
really full (a loopback listener that never accepts, filled with connections until the kernel
drops the next SYN): the watcher and the recovery's fresh probe see a timeout, and a node Slurm
still sees responding (or whose agent beats) is not convicted, while one Slurm flags
NOT_RESPONDING, and a slurmd that refuses, still are. The real-stack flood against a real
slurmd is tests/adversarial/test_probe_flood.py."""

from __future__ import annotations

import logging
import socket
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from relaunch.activities.evidence import probe_now
from relaunch.connectors.liveness import (
    LISTEN_FULL,
    SILENT,
    LivenessMonitor,
    ProbeTarget,
    SynProber,
    make_prober,
    raw_sockets_permitted,
)
from relaunch.connectors.telemetry.heartbeat import heartbeat_path, write_heartbeat
from relaunch.detection.liveness import alive_despite_probe
from relaunch.models.recovery import DetectionSource
from relaunch.models.scheduler import Node, NodeFlag, NodeState
from tests.unit.test_evidence_probe import Cluster, activities, closed_port
from tests.unit.test_liveness import BLACKHOLE
from tests.unit.test_watcher import FakeScheduler
from tests.unit.test_watcher_liveness import job, watcher_for

MAX_HELD = 64  # connections to fill a backlog of 1: a handful are enough on Linux
needs_raw = pytest.mark.skipif(not raw_sockets_permitted(), reason="SYN probes need root")


@pytest.fixture
def flooded() -> Iterator[int]:
    """A port whose listener never accepts and whose accept queue is full: the kernel drops
    the next SYN (no SYN-ACK, no reset), as on a slurmd under a backlog flood."""
    held: list[socket.socket] = []
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        port = int(server.getsockname()[1])
        try:
            for _ in range(MAX_HELD):
                client = socket.socket()
                held.append(client)
                client.settimeout(0.3)
                try:
                    client.connect(("127.0.0.1", port))
                except TimeoutError:
                    break  # the queue is full: this SYN was dropped
            else:
                pytest.fail(f"the backlog never filled after {MAX_HELD} connections")
            yield port
        finally:
            for client in held:
                client.close()


def node(name: str, port: int, *flags: str, state: NodeState = NodeState.ALLOCATED) -> Node:
    return Node(name=name, state=state, flags=list(flags), address="127.0.0.1", port=port)


# ---------------------------------------------------------------- the rule


def test_a_timeout_with_slurm_or_the_agent_vouching_is_alive_anything_else_convicts() -> None:
    up = Node(name="n1", state=NodeState.ALLOCATED)
    silent = Node(name="n1", state=NodeState.ALLOCATED, flags=[NodeFlag.NOT_RESPONDING])
    down = Node(name="n1", state=NodeState.DOWN)
    assert alive_despite_probe("timeout", up) == "Slurm sees its slurmd responding (ALLOCATED)"
    assert alive_despite_probe("timeout", silent, heartbeat_fresh=True) == (
        "its agent's heartbeat is fresh"
    )
    # Slurm no longer hears the node, nor does any agent: the timeout stands.
    assert alive_despite_probe("timeout", silent) is None
    assert alive_despite_probe("timeout", down) is None
    assert alive_despite_probe("timeout", None) is None
    # A reset, silence to a SYN and an ACK, or a network error is the node's kernel or the
    # network speaking: a full backlog drops SYNs, it never refuses them nor drops ACKs.
    for detail in ("refused", SILENT, "unreachable: No route to host"):
        assert alive_despite_probe(detail, up, heartbeat_fresh=True) is None
    # The SYN probe's own word: the kernel reset its ACK. Alive whatever Slurm says.
    assert alive_despite_probe(LISTEN_FULL, down) == (
        "its kernel still resets a bare ACK on that port (slurmd's listen queue is full)"
    )


# ---------------------------------------------------------------- the recovery's fresh probe


async def test_the_evidence_probe_does_not_convict_a_flooded_node_slurm_hears(
    flooded: int,
) -> None:
    evidence = activities(Cluster())
    dead = closed_port()
    nodes = [node("n1", flooded), node("n2", dead)]
    # n1's slurmd gets no SYN answered (its backlog is full) but Slurm hears it; n2 refuses.
    assert await evidence._unreachable(nodes) == ["n2"]
    read = await probe_now(make_prober("connect"), nodes)
    assert read.silent == ["n2"]
    assert read.alive == {
        "n1": "no probe answered (timeout), but Slurm sees its slurmd responding (ALLOCATED)"
    }
    # Once Slurm too stops hearing it, the timeout convicts.
    nodes[0] = node("n1", flooded, NodeFlag.NOT_RESPONDING)
    assert await evidence._unreachable(nodes) == ["n1", "n2"]


# ---------------------------------------------------------------- the watcher


async def test_the_watcher_holds_a_flooded_node_slurm_hears_and_reports_it_once_slurm_does_not(
    flooded: int, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    scheduler = FakeScheduler()
    scheduler.nodes = [node("n1", flooded)]
    scheduler.jobs = [job("101", ["n1"], tmp_path / "101.out")]
    monitor = LivenessMonitor(make_prober("connect"), interval_s=0.1, timeout_s=0.3, failures=3)
    watcher = watcher_for(scheduler, tmp_path, monitor)
    with caplog.at_level(logging.WARNING, logger="relaunch.workers.watcher"):
        assert await watcher.poll_once() == []
        for _ in range(5):
            await monitor.probe_once()
            assert watcher.read_logs_once() == []  # timeouts, but Slurm hears its slurmd
        assert await watcher.poll_once() == []
    assert monitor.state("n1") is not None and monitor.state("n1").detail == "timeout"  # type: ignore[union-attr]
    assert watcher.stats.probe_alive == 1  # one streak, said once
    assert watcher.stats.unreachable_nodes == 0
    said = [r.getMessage() for r in caplog.records if "not reported" in r.getMessage()]
    assert len(said) == 1 and "Slurm sees its slurmd responding" in said[0], said

    # Slurm's next ping fails too: NOT_RESPONDING. Now the probes' word convicts.
    scheduler.set_node("n1", flags=[NodeFlag.NOT_RESPONDING])
    seen = await watcher.poll_once()  # Slurm's flag is also a detection of its own
    await monitor.probe_once()
    seen += watcher.read_logs_once()
    (found,) = [d for d in seen if d.source is DetectionSource.PROBE]
    assert (found.kind, found.source, found.nodes) == (
        "node_unreachable",
        DetectionSource.PROBE,
        ["n1"],
    )
    assert "timeout" in found.text


async def test_a_beating_agent_vouches_for_a_flooded_node_slurm_no_longer_hears(
    flooded: int, tmp_path: Path
) -> None:
    scheduler = FakeScheduler()
    scheduler.nodes = [node("n1", flooded, NodeFlag.NOT_RESPONDING)]
    scheduler.jobs = [job("101", ["n1"], tmp_path / "101.out")]
    monitor = LivenessMonitor(make_prober("connect"), interval_s=0.1, timeout_s=0.3, failures=3)
    watcher = watcher_for(scheduler, tmp_path, monitor)
    beat = heartbeat_path(tmp_path / "nodes" / "n1" / "telemetry.jsonl")
    write_heartbeat(beat, "n1", datetime.now(UTC))
    seen = await watcher.poll_once()  # Slurm's NOT_RESPONDING: a detection of its own
    for _ in range(4):
        await monitor.probe_once()
        write_heartbeat(beat, "n1", datetime.now(UTC))  # the agent beats on
        seen += await watcher.poll_once()
        seen += watcher.read_logs_once()
    assert monitor.state("n1").failures >= 3  # type: ignore[union-attr]
    assert [d for d in seen if d.source is DetectionSource.PROBE] == []
    assert watcher.stats.probe_alive == 1


async def test_a_dead_slurmd_that_refuses_is_still_reported_though_slurm_hears_it(
    tmp_path: Path,
) -> None:
    scheduler = FakeScheduler()
    scheduler.nodes = [node("n1", closed_port())]
    scheduler.jobs = [job("101", ["n1"], tmp_path / "101.out")]
    monitor = LivenessMonitor(make_prober("connect"), interval_s=0.1, timeout_s=0.3, failures=3)
    watcher = watcher_for(scheduler, tmp_path, monitor)
    assert await watcher.poll_once() == []
    for _ in range(3):
        await monitor.probe_once()
    (found,) = watcher.read_logs_once()
    assert found.kind == "node_unreachable" and "refused" in found.text
    assert watcher.stats.probe_alive == 0


# ---------------------------------------------------------------- the SYN probe tells them apart


@needs_raw
async def test_the_syn_probe_tells_a_full_backlog_from_a_silent_host(flooded: int) -> None:
    prober = SynProber()
    try:
        full, gone = await prober.probe(
            [ProbeTarget("n1", "127.0.0.1", flooded), ProbeTarget("n2", BLACKHOLE, 6818)], 0.6
        )
    finally:
        await prober.close()
    assert (full.ok, full.detail) == (False, LISTEN_FULL)
    assert not gone.ok and (gone.detail == SILENT or gone.detail.startswith("unreachable"))


@needs_raw
async def test_with_syn_probes_a_flooded_node_is_alive_and_a_silent_one_convicted_at_once(
    flooded: int, tmp_path: Path
) -> None:
    # Slurm no longer hears n1 (its ping met the flood too) and still lists n2 (it has not
    # pinged it since it went dark): the probes' own word decides both.
    scheduler = FakeScheduler()
    scheduler.nodes = [
        node("n1", flooded, NodeFlag.NOT_RESPONDING),
        Node(name="n2", state=NodeState.ALLOCATED, address=BLACKHOLE, port=6818),
    ]
    scheduler.jobs = [job("101", ["n1", "n2"], tmp_path / "101.out")]
    monitor = LivenessMonitor(SynProber(), interval_s=0.1, timeout_s=0.4, failures=3)
    watcher = watcher_for(scheduler, tmp_path, monitor)
    try:
        seen = await watcher.poll_once()
        for _ in range(3):
            await monitor.probe_once()
        seen += await watcher.poll_once()
        seen += watcher.read_logs_once()
    finally:
        await monitor.prober.close()
    probed = [d for d in seen if d.source is DetectionSource.PROBE]
    assert [d.nodes for d in probed] == [["n2"]], probed
    assert watcher.stats.probe_alive == 1
    syn = make_prober("syn")
    try:
        read = await probe_now(syn, scheduler.nodes[:1])
    finally:
        await syn.close()
    assert read.silent == [] and "listen queue is full" in read.alive["n1"]
