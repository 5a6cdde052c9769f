"""Node liveness probes: is each allocated node's slurmd still reachable, second by second?

slurmctld notices a dead node only after ``SlurmdTimeout`` (about 100 s at best on a default
cluster). The watcher instead probes every watched node's slurmd port once per second,
concurrently, with a short timeout; ``failures`` consecutive failed probes make the node
unreachable (``LivenessMonitor.unreachable``), which the watcher turns into a trusted detection.

**Why a half-open (SYN) probe.** A plain TCP connect and close makes slurmd log errors for
every probe (Slurm 22.05 writes two: "slurm_receive_msg_and_forward: ... Zero Bytes were
transmitted or received" and "service_connection: slurm_receive_msg: Zero Bytes ..."; with
SO_LINGER 0, "Connection reset by peer"): 172,800 lines a day per node at 1 probe/s. The
default ``SynProber`` therefore sends only a TCP SYN from a raw socket (root or CAP_NET_RAW).
The node's kernel answers on behalf of slurmd's listening socket; our kernel, which has no
connection for that SYN-ACK, answers it with a RST, so the handshake never completes, slurmd's
``accept()`` never returns and slurmd neither logs nor spends any CPU on the probe.

What a probe result means (``ProbeResult.detail``):

- ``answered`` (ok): a SYN-ACK (or, for ``ConnectProber``, an accepted connection). The node's
  kernel is up, reachable over the network, and slurmd's listening socket exists.
- ``refused`` (failed): a RST. The host is up but nothing listens on the port: slurmd is dead.
- ``timeout`` (failed, ``ConnectProber`` and ``RemoteProber``): no answer within the timeout:
  the host is powered off, panicked, or off the fabric (or a firewall drops the probe), or
  slurmd's accept queue is full (a job can fill it with idle connections: the kernel then drops
  every SYN), so a timeout alone never convicts (relaunch/detection/liveness.py).
- ``SILENT`` (failed, ``SynProber``): no answer to the SYN nor to a bare ACK sent with its
  second copy: the host is gone or off the fabric.
- ``LISTEN_FULL`` (failed, ``SynProber``): no SYN-ACK, but the node's kernel resets the bare
  ACK: the host is up and slurmd's listen queue is full (a backlog flood, or a hung slurmd).
- ``unreachable: ...``, ``resolve: ...`` or another short error text (failed): the local side
  could not even send the probe (no route, name not resolvable).

**What it cannot see.** A node whose kernel is alive but whose slurmd process is frozen
(SIGSTOP, stuck in D state) still answers SYN probes: the kernel answers SYNs for a listening
socket without the process (tests/unit/test_liveness.py and bench/probe_cost.py show it). The
same holds for ``ConnectProber`` until the listen backlog fills. The node agent's heartbeat
covers that case, not these probes.

A prober raises (a ``RelaunchError``) only when it could not probe at all, for instance when the
SSH host of ``RemoteProber`` is unreachable: that says nothing about the nodes, so the monitor
counts it as an error and leaves every node's state untouched.

The package, one concern a module: ``targets`` (what a round probes and finds, the ``Prober``
protocol), ``packets`` (the SYN on the wire), ``syn`` (``SynProber``), ``connect``
(``ConnectProber``), ``remote`` (``RemoteProber`` and its script) and ``monitor``
(``LivenessMonitor``), ``shared`` (``SharedProber``: one probe of a node for the recoveries
that ask at once). Import from the package itself: it names everything public.
"""

from __future__ import annotations

import logging
from typing import cast

from relaunch.connectors.liveness.connect import ConnectProber
from relaunch.connectors.liveness.monitor import LivenessMonitor, LivenessStats, NodeLiveness
from relaunch.connectors.liveness.packets import (
    classify,
    parse_reply,
    raw_sockets_permitted,
    reserve_port,
    source_address,
    syn_segment,
    tcp_checksum,
)
from relaunch.connectors.liveness.remote import RemoteProber, Runner, remote_script
from relaunch.connectors.liveness.shared import SharedProber
from relaunch.connectors.liveness.syn import SynProber
from relaunch.connectors.liveness.targets import (
    LISTEN_FULL,
    MAX_TARGETS,
    MAX_TIMEOUT_S,
    SILENT,
    ProbeError,
    Prober,
    ProbeResult,
    ProbeTarget,
    probe_address,
    probe_port,
)

__all__ = [
    "LISTEN_FULL",
    "MAX_TARGETS",
    "SILENT",
    "MAX_TIMEOUT_S",
    "ConnectProber",
    "LivenessMonitor",
    "LivenessStats",
    "NodeLiveness",
    "ProbeError",
    "ProbeResult",
    "ProbeTarget",
    "Prober",
    "RemoteProber",
    "Runner",
    "SharedProber",
    "SynProber",
    "classify",
    "make_prober",
    "parse_reply",
    "probe_address",
    "probe_port",
    "raw_sockets_permitted",
    "remote_script",
    "reserve_port",
    "source_address",
    "syn_segment",
    "tcp_checksum",
]

log = logging.getLogger("relaunch.liveness")

_warned_connect = False


def make_prober(method: str = "auto", *, runner: object | None = None) -> Prober:
    """The prober for ``method``: "syn", "connect", "ssh" (needs ``runner``) or "auto".

    auto: RemoteProber when a runner is given, else SynProber when raw sockets are permitted,
    else ConnectProber (with a warning, once, that slurmd will log each probe)."""
    global _warned_connect
    if method == "auto":
        if runner is not None:
            method = "ssh"
        elif raw_sockets_permitted():
            method = "syn"
        else:
            if not _warned_connect:
                _warned_connect = True
                log.warning(
                    "raw sockets are not permitted (run as root or grant CAP_NET_RAW): probing "
                    "nodes with TCP connects, and slurmd logs errors for every probe"
                )
            method = "connect"
    if method == "syn":
        if not raw_sockets_permitted():
            raise ProbeError(
                "SYN probes need a raw socket, which this process may not open",
                hint="run as root or grant CAP_NET_RAW, or use the connect method",
            )
        return SynProber()
    if method == "connect":
        return ConnectProber()
    if method == "ssh":
        if runner is None or not callable(getattr(runner, "run", None)):
            raise ValueError("the ssh probe method needs a runner with an async run()")
        return RemoteProber(cast(Runner, runner))
    raise ValueError(f"unknown probe method {method!r}; one of auto, syn, connect, ssh")
