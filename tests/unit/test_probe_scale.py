"""Liveness probes at cluster scale: a SYN round over 1,000 nodes answers every live node.

Each node is a real listening socket on this host (the kernel answers a SYN for a listener,
as it does for slurmd's: bench/probe_cost.py measures the same with real slurmds). On
loopback every SYN-ACK arrives while the round is still sending; a raw socket's receive buffer
(net.core.rmem_default, 208 KiB) holds about 380 of them, so a round that sends all its SYNs
before reading lost the rest and called some 600 live nodes silent, three rounds in a row:
false ``node_unreachable`` detections for every job on them.
"""

from __future__ import annotations

import asyncio
import resource
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence

import pytest

from relaunch.connectors.liveness import (
    LivenessMonitor,
    ProbeTarget,
    RemoteProber,
    SynProber,
    raw_sockets_permitted,
)
from relaunch.connectors.slurm.runner import CommandResult

NODES = 1000

pytestmark = pytest.mark.skipif(
    not raw_sockets_permitted(), reason="raw sockets are not permitted here (root or CAP_NET_RAW)"
)


@pytest.fixture
def listeners() -> Iterator[list[socket.socket]]:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = NODES + 512
    if hard != resource.RLIM_INFINITY and hard < need:
        pytest.skip(f"the open-file limit ({hard}) is below {need}")
    if soft != resource.RLIM_INFINITY and soft < need:
        resource.setrlimit(resource.RLIMIT_NOFILE, (need, hard))
    socks: list[socket.socket] = []
    try:
        for _ in range(NODES):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            socks.append(sock)
            sock.bind(("127.0.0.1", 0))
            sock.listen(128)
        yield socks
    finally:
        for sock in socks:
            sock.close()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def targets_of(socks: list[socket.socket]) -> list[ProbeTarget]:
    return [ProbeTarget(f"n{i}", "127.0.0.1", int(s.getsockname()[1])) for i, s in enumerate(socks)]


async def test_a_syn_round_over_1000_live_nodes_answers_every_one(
    listeners: list[socket.socket],
) -> None:
    prober = SynProber()
    try:
        start = time.monotonic()
        results = await prober.probe(targets_of(listeners), 1.0)
        took = time.monotonic() - start
    finally:
        await prober.close()
    silent = [r.node for r in results if not r.ok]
    assert silent == [], f"{len(silent)} of {NODES} live nodes not answered"
    # Answered by the first SYNs: no node waited for the second copy at half the timeout.
    assert took < 0.5, took


async def test_three_rounds_over_1000_live_nodes_call_none_unreachable(
    listeners: list[socket.socket],
) -> None:
    prober = SynProber()
    monitor = LivenessMonitor(prober, interval_s=1.0, timeout_s=1.0, failures=3)
    monitor.watch(targets_of(listeners))
    try:
        for _ in range(3):
            await monitor.probe_once()
    finally:
        await prober.close()
    assert monitor.unreachable() == {}
    assert monitor.stats.probes == 3 * NODES
    assert monitor.stats.failed == 0


class SubprocessRunner:
    """Runs RemoteProber's ``python3 -`` here, for real, as SshRunner would on the SSH host."""

    async def run(
        self, argv: Sequence[str], *, stdin: str | None = None, timeout: float = 30.0
    ) -> CommandResult:
        argv = [sys.executable if a == "python3" else a for a in argv]
        start = time.monotonic()
        done = await asyncio.to_thread(
            subprocess.run, argv, input=stdin, capture_output=True, text=True, timeout=timeout
        )
        return CommandResult(
            tuple(argv), done.returncode, done.stdout, done.stderr, time.monotonic() - start
        )


async def test_a_remote_syn_round_over_1000_live_nodes_answers_every_one(
    listeners: list[socket.socket],
) -> None:
    prober = RemoteProber(SubprocessRunner())
    results = await prober.probe(targets_of(listeners), 1.0)
    assert prober.last_method == "syn"
    silent = [r.node for r in results if not r.ok]
    assert silent == [], f"{len(silent)} of {NODES} live nodes not answered"
