"""Probe cost: what node liveness probing at 1 s costs the watcher and each slurmd.

Starts a private Slurm (munged, slurmctld and ``--nodes`` ``slurmd -N`` daemons on free ports,
under a temporary directory; nothing else of the stack), then measures three windows of
``--seconds`` each:

- idle: no probes (the baseline: slurmd housekeeping and slurmctld's own pings);
- syn: ``LivenessMonitor`` over every node at ``--interval`` with ``SynProber``;
- connect: the same with ``ConnectProber``.

For each window: the probing process's CPU seconds per second (``time.process_time`` deltas),
probes/s, round duration p50/p95, and per slurmd: connections accepted per second (slurmd logs
one "service_connection: ... Zero Bytes" line per connection that carried no message), log
lines per second, and CPU seconds per second summed over all slurmds (psutil). The host's
``Tcp: PassiveOpens`` counter (connections completed by any listener on this machine) is
reported too; other programs on the host add to it.

Slurm's own load for comparison: slurmctld sends each node a ping (REQUEST_PING, a munge-
authenticated RPC slurmd receives, authenticates, handles and answers) every SlurmdTimeout/3,
that is every 100 s at the default SlurmdTimeout=300 (the private cluster uses that default).

Writes bench/results/probe_cost.json and probe_cost.md; tears the cluster down at the end, always.

``--sizes 64,256,500,1000`` measures instead how one round grows with the number of nodes: one
private Slurm with ``--real`` (default 256) real slurmds, and for the nodes beyond, simulated
ones: plain TCP listeners that accept and close, in a process of their own
(bench/probe_listeners.py, which says what they stand in for). For each size, a SYN and a
connect window of ``--seconds``: round duration p50/p95/max, its spread (from the first probe
of a round sent to the last: when the last node is looked at), the probing process's CPU
share, probes/s, and per probed real slurmd connections/s and CPU; then a frozen and a killed
slurmd among the largest size's nodes. Writes bench/results/probe_scale.json and .md.

Usage:
    python bench/probe_cost.py [--nodes 64] [--seconds 60] [--interval 1.0] [--timeout 1.0]
    python bench/probe_cost.py --sizes 64,256,500,1000 [--real 256] [--seconds 20]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.append(str(ROOT))

from relaunch.connectors.liveness import (  # noqa: E402
    MAX_TARGETS,
    ConnectProber,
    LivenessMonitor,
    Prober,
    ProbeResult,
    ProbeTarget,
    SynProber,
    raw_sockets_permitted,
)
from relaunch.connectors.liveness.syn import _RawChannel  # noqa: E402
from relaunch.devstack import procs  # noqa: E402
from relaunch.devstack.slurm import (  # noqa: E402
    SlurmLayout,
    require_binaries,
    slurmd_pid,
    start_daemons,
    start_munge,
    write_conf,
)
from relaunch.models.errors import RelaunchError  # noqa: E402

MAX_NODES = 1024
MAX_SECONDS = 3600
ACCEPTED = "service_connection"  # one line per accepted connection that carried no message


def log(msg: str) -> None:
    print(f"[{datetime.now(UTC):%H:%M:%S}] {msg}", flush=True)


# ---------------------------------------------------------------------- the private cluster


def slurm_layout(root: Path, nodes: int) -> SlurmLayout:
    base = procs.free_port()
    while any(procs.port_open(base + i) for i in range(nodes)) or base + nodes > 65000:
        base = procs.free_port()
    return SlurmLayout(
        root=root / "slurm",
        cluster="probecost",
        nodes=[f"n{i}" for i in range(1, nodes + 1)],
        slurmctld_port=procs.free_port(),
        slurmd_ports=[base + i for i in range(nodes)],
        restd_port=procs.free_port(),
        cred_expire=10,
    )


def start_cluster(layout: SlurmLayout) -> None:
    require_binaries(layout)
    write_conf(layout)
    start_munge(layout)
    start_daemons(layout)
    procs.wait_for(lambda: nodes_idle(layout) == len(layout.nodes), 120, "slurm nodes", 1.0)


def nodes_idle(layout: SlurmLayout) -> int:
    out = subprocess.run(
        ["sinfo", "--noheader", "--Node", "--format=%N %t"],
        env={**os.environ, **layout.env},
        capture_output=True,
        text=True,
        timeout=20,
        check=False,
    )
    # One line per node and partition (the dev cluster has two): count the nodes.
    return len(
        {line.split()[0] for line in out.stdout.splitlines() if line.split()[1:] == ["idle"]}
    )


def stop_cluster(root: Path, layout: SlurmLayout) -> int:
    found = procs.stack_processes(root, layout.conf)
    stopped = procs.terminate(found)
    left = procs.stack_processes(root, layout.conf)
    if left:
        raise RelaunchError(f"{len(left)} processes would not stop: {[p.pid for p in left]}")
    return stopped


# ---------------------------------------------------------------------- measuring


@dataclass
class Snapshot:
    wall: float
    cpu: float  # this process
    slurmd_cpu: float
    slurmctld_cpu: float
    log_lines: dict[str, int]
    accepted: dict[str, int]
    passive_opens: int


def _cpu(pid: int | None) -> float:
    if pid is None:
        return 0.0
    try:
        t = psutil.Process(pid).cpu_times()
    except psutil.Error:
        return 0.0
    return float(t.user + t.system)


def _count(path: Path) -> tuple[int, int]:
    lines = accepted = 0
    try:
        with open(path, errors="replace") as fh:
            for line in fh:
                lines += 1
                accepted += ACCEPTED in line
    except OSError:
        pass
    return lines, accepted


def _passive_opens() -> int:
    with open("/proc/net/snmp") as fh:
        rows = [line.split() for line in fh if line.startswith("Tcp:")]
    return int(rows[1][rows[0].index("PassiveOpens")])


def snapshot(layout: SlurmLayout, pids: dict[str, int | None], ctld: int | None) -> Snapshot:
    counts = {node: _count(layout.node_log(node)) for node in pids}
    slurmd_cpu = sum(_cpu(pid) for pid in pids.values())
    slurmctld_cpu = _cpu(ctld)
    passive_opens = _passive_opens()
    return Snapshot(  # stamped last: the reading above is not charged to the window
        wall=time.monotonic(),
        cpu=time.process_time(),
        slurmd_cpu=slurmd_cpu,
        slurmctld_cpu=slurmctld_cpu,
        log_lines={n: c[0] for n, c in counts.items()},
        accepted={n: c[1] for n, c in counts.items()},
        passive_opens=passive_opens,
    )


Mark = tuple[float, float | None]  # a probe's monotonic send time and answer time (None: none)


class MarkedSyn(SynProber):
    """``SynProber`` that notes when each probe was sent and answered (the round's spread)."""

    def __init__(self) -> None:
        super().__init__()
        self.marks: list[tuple[float, asyncio.Future[tuple[str, float]]]] = []

    def _send(
        self,
        channel: _RawChannel,
        address: str,
        port: int,
        used: list[tuple[_RawChannel, tuple[bytes, int]]],
    ) -> asyncio.Future[tuple[str, float]]:
        sent = time.monotonic()
        fut = super()._send(channel, address, port, used)
        self.marks.append((sent, fut))
        return fut

    def take_marks(self) -> list[Mark]:
        out: list[Mark] = []
        for sent, fut in self.marks:
            answered = None
            if fut.done() and not fut.cancelled() and fut.result()[0] == "answered":
                answered = sent + fut.result()[1]
            out.append((sent, answered))
        self.marks = []
        return out


class MarkedConnect(ConnectProber):
    """``ConnectProber`` that notes when each probe was sent and answered."""

    def __init__(self) -> None:
        self.marks: list[Mark] = []

    async def _one(self, target: ProbeTarget, timeout_s: float) -> ProbeResult:
        sent = time.monotonic()
        result = await super()._one(target, timeout_s)
        self.marks.append((sent, sent + result.took_s if result.ok else None))
        return result

    def take_marks(self) -> list[Mark]:
        out, self.marks = self.marks, []
        return out


class TimedProber:
    """Passes rounds to ``inner`` and keeps each round's duration and outcome counts, and, for
    the marked probers, each round's spread: from its first probe sent to its last (when the
    last node is looked at; on loopback a probe lands within microseconds of being sent) and
    from its first probe sent to its last answer."""

    def __init__(self, inner: Prober) -> None:
        self.inner = inner
        self.method = inner.method
        self.durations: list[float] = []
        self.spreads: list[float] = []
        self.last_answers: list[float] = []
        self.details: dict[str, int] = {}

    async def probe(self, targets: Sequence[ProbeTarget], timeout_s: float) -> list[ProbeResult]:
        start = time.perf_counter()
        results = await self.inner.probe(targets, timeout_s)
        self.durations.append(time.perf_counter() - start)
        for r in results:
            self.details[r.detail] = self.details.get(r.detail, 0) + 1
        take = getattr(self.inner, "take_marks", None)
        marks: list[Mark] = take() if take is not None else []
        if marks:
            first = min(sent for sent, _ in marks)
            self.spreads.append(max(sent for sent, _ in marks) - first)
            answers = [a for _, a in marks if a is not None]
            if answers:
                self.last_answers.append(max(answers) - first)
        return results

    async def close(self) -> None:
        await self.inner.close()


@dataclass
class Window:
    name: str
    seconds: float
    nodes: int
    probe_cpu_s_per_s: float
    probes_per_s: float
    rounds: int
    round_p50_ms: float
    round_p95_ms: float
    outcomes: dict[str, int]
    errors: int
    slurmd_accepted_per_s_per_node: float
    slurmd_accepted_max_node: int
    slurmd_log_lines_per_s_per_node: float
    slurmd_cpu_s_per_s_all: float
    slurmd_cpu_s_per_s_per_node: float
    slurmctld_cpu_s_per_s: float
    host_passive_opens_per_s: float
    extra: dict[str, Any] = field(default_factory=dict)
    method: str = ""
    real_nodes: int = 0  # probed nodes that are real slurmds
    simulated_nodes: int = 0  # probed nodes that are plain listeners (bench/probe_listeners.py)
    round_max_ms: float = 0.0
    spread_p50_ms: float = 0.0  # first probe sent to last probe sent, per round
    spread_p95_ms: float = 0.0
    spread_max_ms: float = 0.0
    last_answer_p95_ms: float = 0.0  # first probe sent to last answer, per round
    listeners_cpu_s_per_s: float = 0.0  # the simulated nodes' process


def _pct(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def measure(
    name: str,
    layout: SlurmLayout,
    targets: list[ProbeTarget],
    prober: Prober | None,
    args: argparse.Namespace,
    probed: list[str] | None = None,
    listeners: int | None = None,
) -> Window:
    """One window. Per-slurmd figures are over ``probed`` (the real nodes among the targets;
    all of the cluster's by default); ``listeners`` is the simulated nodes' process."""
    real = list(layout.nodes if probed is None else probed)
    pids = {node: slurmd_pid(layout, node) for node in real}
    ctld = procs.read_pid(layout.root / "run" / "slurmctld.pid")
    timed = TimedProber(prober) if prober is not None else None
    monitor = None
    listeners_before = _cpu(listeners)
    before = snapshot(layout, pids, ctld)
    if timed is not None:
        monitor = LivenessMonitor(timed, interval_s=args.interval, timeout_s=args.timeout)
        monitor.watch(targets)
        stop = asyncio.Event()
        task = asyncio.create_task(monitor.run(stop))
        await asyncio.sleep(args.seconds)
        stop.set()
        await task
        await timed.close()
    else:
        await asyncio.sleep(args.seconds)
    span = time.monotonic() - before.wall
    probe_cpu = time.process_time() - before.cpu
    listeners_cpu = _cpu(listeners) - listeners_before
    # slurmd writes its log line after the connection closes; let the last ones land.
    await asyncio.sleep(0.5)
    after = snapshot(layout, pids, ctld)
    n = len(real)
    accepted = {node: after.accepted[node] - before.accepted[node] for node in real}
    lines = sum(after.log_lines[node] - before.log_lines[node] for node in real)
    durations = timed.durations if timed else []
    spreads = timed.spreads if timed else []
    stats = monitor.stats if monitor else None
    return Window(
        name=name,
        seconds=round(span, 2),
        nodes=len(targets) if prober is not None else n,
        method=prober.method if prober is not None else "",
        real_nodes=n,
        simulated_nodes=(len(targets) - n) if prober is not None else 0,
        round_max_ms=max(durations, default=0.0) * 1000,
        spread_p50_ms=statistics.median(spreads) * 1000 if spreads else 0.0,
        spread_p95_ms=_pct(spreads, 0.95) * 1000,
        spread_max_ms=max(spreads, default=0.0) * 1000,
        last_answer_p95_ms=_pct(timed.last_answers if timed else [], 0.95) * 1000,
        listeners_cpu_s_per_s=listeners_cpu / span,
        probe_cpu_s_per_s=probe_cpu / span,
        probes_per_s=(stats.probes / span) if stats else 0.0,
        rounds=stats.rounds if stats else 0,
        round_p50_ms=statistics.median(durations) * 1000 if durations else 0.0,
        round_p95_ms=_pct(durations, 0.95) * 1000,
        outcomes=dict(timed.details) if timed else {},
        errors=stats.errors if stats else 0,
        slurmd_accepted_per_s_per_node=sum(accepted.values()) / span / n,
        slurmd_accepted_max_node=max(accepted.values()),
        slurmd_log_lines_per_s_per_node=lines / span / n,
        slurmd_cpu_s_per_s_all=(after.slurmd_cpu - before.slurmd_cpu) / span,
        slurmd_cpu_s_per_s_per_node=(after.slurmd_cpu - before.slurmd_cpu) / span / n,
        slurmctld_cpu_s_per_s=(after.slurmctld_cpu - before.slurmctld_cpu) / span,
        host_passive_opens_per_s=(after.passive_opens - before.passive_opens) / span,
    )


async def semantics(layout: SlurmLayout, targets: list[ProbeTarget]) -> dict[str, Any]:
    """What a frozen and a killed slurmd look like to the probes, on this cluster's n1 and n2:
    SIGSTOP n1's slurmd (then SIGCONT), SIGKILL n2's and time how long a monitor at 1 s with
    failures=3 takes to call it unreachable."""
    out: dict[str, Any] = {}
    frozen, killed = targets[0], targets[1]
    pid = slurmd_pid(layout, frozen.node)
    if pid is not None:
        prober = SynProber()
        os.kill(pid, signal.SIGSTOP)
        try:
            syn = [(await prober.probe([frozen], 1.0))[0].detail for _ in range(3)]
            con = [(await ConnectProber().probe([frozen], 1.0))[0].detail for _ in range(3)]
        finally:
            os.kill(pid, signal.SIGCONT)
            await prober.close()
        out["frozen_slurmd"] = {"syn": syn, "connect": con}
    pid = slurmd_pid(layout, killed.node)
    if pid is not None:
        prober = SynProber()
        monitor = LivenessMonitor(prober, interval_s=1.0, timeout_s=1.0, failures=3)
        monitor.watch(targets)
        stop = asyncio.Event()
        task = asyncio.create_task(monitor.run(stop))
        await asyncio.sleep(2.2)
        os.kill(pid, signal.SIGKILL)
        t0 = time.monotonic()
        while killed.node not in monitor.unreachable() and time.monotonic() - t0 < 30:
            await asyncio.wait_for(monitor.round_done.wait(), 5)
            await asyncio.sleep(0.01)
        took = time.monotonic() - t0
        stop.set()
        await task
        await prober.close()
        down = monitor.unreachable()
        out["killed_slurmd"] = {
            "unreachable_after_s": round(took, 2),
            "detail": down[killed.node].detail if killed.node in down else None,
            "others_unreachable": sorted(set(down) - {killed.node}),
        }
    return out


# ---------------------------------------------------------------------- report


def report(
    windows: list[Window], checks: dict[str, Any], args: argparse.Namespace, started: str
) -> str:
    ping_interval = 300 / 3
    rows = [
        "| window | probe CPU s/s | probes/s | round p50 / p95 (ms) | slurmd conns/s per node "
        "| slurmd log lines/s per node | slurmd CPU s/s (all nodes) | host PassiveOpens/s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for w in windows:
        rows.append(
            f"| {w.name} | {w.probe_cpu_s_per_s:.4f} | {w.probes_per_s:.1f} | "
            f"{w.round_p50_ms:.2f} / {w.round_p95_ms:.2f} | "
            f"{w.slurmd_accepted_per_s_per_node:.3f} | {w.slurmd_log_lines_per_s_per_node:.3f} "
            f"| {w.slurmd_cpu_s_per_s_all:.4f} | {w.host_passive_opens_per_s:.1f} |"
        )
    by = {w.name: w for w in windows}
    lines = [
        f"# Probe cost: node liveness probes at {args.nodes} nodes × {args.interval:g} s",
        "",
        f"Measured {started} by `python bench/probe_cost.py --nodes {args.nodes} --seconds "
        f"{args.seconds:g}` on this machine ({os.cpu_count()} CPUs, shared with other work): a "
        f"private Slurm 22.05 with {args.nodes} `slurmd -N` daemons on 127.0.0.1, one "
        f"LivenessMonitor over all of them (interval {args.interval:g} s, timeout "
        f"{args.timeout:g} s), {args.seconds:g} s per window.",
        "",
        *rows,
        "",
        "Probe outcomes: "
        + "; ".join(f"{w.name}: {w.outcomes or '-'} (errors {w.errors})" for w in windows),
        "",
        "## Against Slurm's own pings",
        "",
        f"slurmctld pings each node every SlurmdTimeout/3 = {ping_interval:.0f} s at the default "
        f"SlurmdTimeout=300: {1 / ping_interval:.2f} connections/s per slurmd, each a "
        "munge-authenticated RPC that slurmd reads, authenticates (a munged round trip) and "
        "answers.",
        "",
    ]
    if "syn" in by and "idle" in by:
        syn, idle = by["syn"], by["idle"]
        lines += [
            f"- **SYN probe**: {syn.slurmd_accepted_per_s_per_node:.3f} connections/s per slurmd "
            f"(busiest node: {syn.slurmd_accepted_max_node} in the window) and "
            f"{syn.slurmd_log_lines_per_s_per_node:.3f} log lines/s, against "
            f"{idle.slurmd_log_lines_per_s_per_node:.3f} idle; slurmd CPU "
            f"{syn.slurmd_cpu_s_per_s_all:.4f} s/s over all nodes against "
            f"{idle.slurmd_cpu_s_per_s_all:.4f} idle. slurmd's process never sees the probe: "
            "the SYN-ACK comes from the node's kernel and our kernel's RST ends the half-open "
            "connection before accept(). It loads slurmd less than Slurm's own pings (zero "
            "against one RPC per 100 s). The kernel work (one SYN, SYN-ACK, RST) is not "
            "charged to slurmd.",
        ]
    if "connect" in by and "idle" in by:
        con, idle = by["connect"], by["idle"]
        extra_cpu = con.slurmd_cpu_s_per_s_per_node - idle.slurmd_cpu_s_per_s_per_node
        per_probe_us = extra_cpu / max(con.slurmd_accepted_per_s_per_node, 1e-9) * 1e6
        lines += [
            f"- **connect probe** (fallback): {con.slurmd_accepted_per_s_per_node:.3f} "
            f"connections/s per slurmd, {con.slurmd_accepted_per_s_per_node * ping_interval:.0f}"
            f"× Slurm's ping rate, {con.slurmd_log_lines_per_s_per_node:.2f} error lines/s per "
            f"slurmd ({con.slurmd_log_lines_per_s_per_node * 86400:,.0f} a day per node), "
            f"about {per_probe_us:.0f} µs of slurmd CPU per probe.",
        ]
    for w in windows:
        if w.probes_per_s:
            lines.append(
                f"- watcher CPU per {w.name} probe: "
                f"{w.probe_cpu_s_per_s / w.probes_per_s * 1e6:.0f} µs "
                f"({w.probe_cpu_s_per_s * 100:.2f}% of one core at {w.probes_per_s:.0f} probes/s)."
            )
    frozen, killed = checks.get("frozen_slurmd"), checks.get("killed_slurmd")
    if frozen or killed:
        lines += ["", "## What a frozen and a killed slurmd look like", ""]
    if frozen:
        lines.append(
            f"- slurmd SIGSTOPped: SYN probes {frozen['syn']}, connect probes "
            f"{frozen['connect']}. The kernel answers for a listening socket without the process: "
            "a hung slurmd is not seen by either probe (the node agent's heartbeat covers it)."
        )
    if killed:
        lines.append(
            f"- slurmd SIGKILLed: unreachable ({killed['detail']}) "
            f"{killed['unreachable_after_s']} s after the kill, with a monitor at 1 s and "
            f"failures=3; other nodes called unreachable: {killed['others_unreachable'] or 'none'}."
        )
    lines += [
        "",
        "The probing process's CPU (first column) includes the event loop, the monitor's "
        "bookkeeping and, for the SYN prober, building and parsing packets in Python. slurmd CPU "
        "comes from /proc, in clock ticks (10 ms per process and window). Host PassiveOpens "
        "counts connections completed by any listener on this host (other programs add to "
        "it); a SYN probe never completes one.",
        "",
        "Raw numbers: [probe_cost.json](probe_cost.json).",
        "",
    ]
    return "\n".join(lines)


# ---------------------------------------------------------------------- scale (--sizes)

MAX_SIZES = 8
LISTENERS = ROOT / "bench" / "probe_listeners.py"


def start_listeners(count: int) -> tuple[subprocess.Popen[str], list[int]]:
    """The simulated nodes: bench/probe_listeners.py in its own process, and their ports. It
    exits when its stdin closes, so it never outlives this process."""
    proc = subprocess.Popen(
        [sys.executable, str(LISTENERS), str(count)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line:
        proc.wait(10)
        raise RelaunchError(f"the simulated nodes' process exited ({proc.returncode})")
    return proc, [int(port) for port in json.loads(line)["ports"]]


def stop_listeners(proc: subprocess.Popen[str]) -> None:
    if proc.stdin is not None:
        proc.stdin.close()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)


def slurmd_memory(layout: SlurmLayout, available_before: int) -> dict[str, Any]:
    """What the real slurmds hold: mean RSS, USS and PSS per slurmd (psutil), slurmctld's RSS,
    and the drop in the host's available memory since before the cluster started, per slurmd
    (it counts slurmctld, munged and the kernel's share, and anything else the host did)."""
    rss, uss, pss = [], [], []
    for node in layout.nodes:
        pid = slurmd_pid(layout, node)
        if pid is None:
            continue
        try:
            info = psutil.Process(pid).memory_full_info()
        except psutil.Error:
            continue
        rss.append(info.rss)
        uss.append(info.uss)
        pss.append(getattr(info, "pss", 0))
    ctld = procs.read_pid(layout.root / "run" / "slurmctld.pid")
    ctld_rss = 0
    if ctld is not None:
        with contextlib.suppress(psutil.Error):
            ctld_rss = psutil.Process(ctld).memory_info().rss
    n = max(len(rss), 1)
    mib = 1024 * 1024
    dropped = available_before - psutil.virtual_memory().available
    return {
        "slurmds": len(rss),
        "rss_mib_per_slurmd": round(sum(rss) / n / mib, 2),
        "uss_mib_per_slurmd": round(sum(uss) / n / mib, 2),
        "pss_mib_per_slurmd": round(sum(pss) / n / mib, 2),
        "slurmctld_rss_mib": round(ctld_rss / mib, 1),
        "host_available_drop_mib_per_slurmd": round(dropped / n / mib, 2),
        "host_total_gib": round(psutil.virtual_memory().total / mib / 1024, 1),
        "host_available_gib": round(psutil.virtual_memory().available / mib / 1024, 1),
    }


def raise_open_files(need: int) -> None:
    """Lift this process's soft open-file limit to ``need`` (its children inherit it): a
    connect round holds one socket per node, the simulated nodes one listener each."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= need:
        return
    if hard != resource.RLIM_INFINITY and hard < need:
        raise RelaunchError(f"the open-file limit ({hard}) is below the {need} this run needs")
    resource.setrlimit(resource.RLIMIT_NOFILE, (need, hard))


async def run_scale(args: argparse.Namespace) -> dict[str, Any]:
    sizes: list[int] = args.sizes
    real = min(max(sizes), args.real)
    simulated = max(sizes) - real
    raise_open_files(2 * max(sizes) + 1024)
    work = Path(tempfile.mkdtemp(prefix="relaunch-probe-scale-"))
    layout = slurm_layout(work, real)
    listeners: subprocess.Popen[str] | None = None
    windows: list[Window] = []
    out: dict[str, Any] = {"real": real, "simulated_max": simulated}
    try:
        available = psutil.virtual_memory().available
        log(f"starting a private Slurm: munged, slurmctld, {real} slurmd under {work}")
        t0 = time.monotonic()
        await asyncio.to_thread(start_cluster, layout)
        out["cluster_start_s"] = round(time.monotonic() - t0, 1)
        log(f"{real} nodes idle after {out['cluster_start_s']}s; settling 5s")
        await asyncio.sleep(5)
        out["memory"] = slurmd_memory(layout, available)
        log(f"  memory: {out['memory']}")
        real_targets = [
            ProbeTarget(node, "127.0.0.1", port)
            for node, port in zip(layout.nodes, layout.slurmd_ports, strict=True)
        ]
        sim_targets: list[ProbeTarget] = []
        if simulated:
            proc, ports = await asyncio.to_thread(start_listeners, simulated)
            listeners = proc
            sim_targets = [ProbeTarget(f"sim{i}", "127.0.0.1", p) for i, p in enumerate(ports, 1)]
            log(f"{simulated} simulated nodes (listeners) in process {proc.pid}")
        pid = listeners.pid if listeners else None
        log(f"window idle: {args.seconds:g}s")
        windows.append(await measure("idle", layout, real_targets, None, args, None, pid))
        for size in sizes:
            n_real = min(size, real)
            targets = real_targets[:n_real] + sim_targets[: size - n_real]
            plan: list[Prober] = [MarkedSyn()] if raw_sockets_permitted() else []
            plan.append(MarkedConnect())
            for prober in plan:
                name = f"{prober.method}@{size}"
                log(f"window {name} ({n_real} real, {size - n_real} simulated): {args.seconds:g}s")
                w = await measure(name, layout, targets, prober, args, layout.nodes[:n_real], pid)
                windows.append(w)
                log(
                    f"  {name}: round p50 {w.round_p50_ms:.1f} p95 {w.round_p95_ms:.1f} max "
                    f"{w.round_max_ms:.1f} ms, spread p50 {w.spread_p50_ms:.1f} p95 "
                    f"{w.spread_p95_ms:.1f} ms, CPU {w.probe_cpu_s_per_s * 100:.2f}%, "
                    f"{w.probes_per_s:.0f} probes/s, outcomes {w.outcomes}"
                )
        if raw_sockets_permitted() and len(real_targets) >= 2:
            largest = real_targets + sim_targets
            log(f"frozen (SIGSTOP) and killed (SIGKILL) slurmd among {len(largest)} nodes")
            out["checks"] = await semantics(layout, largest)
            out["checks_nodes"] = len(largest)
            log(f"  {out['checks']}")
    finally:
        if listeners is not None:
            stop_listeners(listeners)
        log("tearing the private Slurm down")
        try:
            stopped = await asyncio.to_thread(stop_cluster, work, layout)
            log(f"stopped {stopped} processes")
        finally:
            if not args.keep:
                shutil.rmtree(work, ignore_errors=True)
    out["windows"] = windows
    return out


def report_scale(result: dict[str, Any], args: argparse.Namespace, started: str) -> str:
    windows: list[Window] = result["windows"]
    mem = result.get("memory", {})
    idle = next((w for w in windows if w.name == "idle"), None)
    idle_cpu = idle.slurmd_cpu_s_per_s_per_node if idle else 0.0
    sizes = ",".join(str(n) for n in args.sizes)
    rows = [
        "| size | real | simulated | probe | round p50 / p95 / max (ms) | spread p50 / p95 (ms) "
        "| last answer p95 (ms) | probe CPU % | probes/s | failed | per real slurmd: conns/s, "
        "CPU µs/probe | listeners CPU % |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for w in windows:
        if not w.method:
            continue
        failed = sum(c for d, c in w.outcomes.items() if d != "answered") + w.errors
        per_probe = ""
        if w.slurmd_accepted_per_s_per_node > 0:
            extra = w.slurmd_cpu_s_per_s_per_node - idle_cpu
            per_probe = f", {extra / w.slurmd_accepted_per_s_per_node * 1e6:.0f}"
        rows.append(
            f"| {w.nodes} | {w.real_nodes} | {w.simulated_nodes} | {w.method} | "
            f"{w.round_p50_ms:.1f} / {w.round_p95_ms:.1f} / {w.round_max_ms:.1f} | "
            f"{w.spread_p50_ms:.1f} / {w.spread_p95_ms:.1f} | {w.last_answer_p95_ms:.1f} | "
            f"{w.probe_cpu_s_per_s * 100:.2f} | {w.probes_per_s:.0f} | {failed} | "
            f"{w.slurmd_accepted_per_s_per_node:.2f}{per_probe} | "
            f"{w.listeners_cpu_s_per_s * 100:.2f} |"
        )
    beyond = (
        f"and, beyond them, up to {result['simulated_max']} simulated nodes (plain TCP "
        "listeners that accept and close, in a process of their own: bench/probe_listeners.py)"
        if result["simulated_max"]
        else "and no simulated node"
    )
    lines = [
        f"# Probe cost at scale: one round at {sizes} nodes × {args.interval:g} s",
        "",
        f"Measured {started} by `python bench/probe_cost.py --sizes {sizes} --real {args.real} "
        f"--seconds {args.seconds:g}` on this machine ({os.cpu_count()} CPUs, shared with other "
        f"work): a private Slurm 22.05 with {result['real']} real `slurmd -N` daemons on "
        f"127.0.0.1 {beyond}; one LivenessMonitor over the first `size` nodes (real first), "
        f"interval {args.interval:g} s, timeout {args.timeout:g} s, {args.seconds:g} s per "
        "window.",
        "",
        *rows,
        "",
        "- **round**: one `probe()` call over every node (the monitor's round); **spread**: "
        "from the round's first probe sent to its last (on loopback a probe lands within "
        "microseconds: the last node is looked at this much later than the first); **last "
        "answer**: from the first probe sent to the last answer. **probe CPU %**: the probing "
        "process's CPU time over the window (event loop, monitor, building the SYNs in Python). "
        "**per real slurmd**: connections each probed slurmd accepted per second (its log) and "
        "its CPU per probe above idle (clock ticks: coarse at 20 s); a SYN probe never reaches "
        "slurmd. **failed**: probes that were not answered, over the window.",
    ]
    if mem:
        lines += [
            "",
            "## What a real slurmd holds",
            "",
            f"{mem['slurmds']} `slurmd -N` daemons started in {result.get('cluster_start_s')} s: "
            f"per slurmd RSS {mem['rss_mib_per_slurmd']} MiB, USS {mem['uss_mib_per_slurmd']} "
            f"MiB, PSS {mem['pss_mib_per_slurmd']} MiB; the host's available memory fell by "
            f"{mem['host_available_drop_mib_per_slurmd']} MiB per slurmd (slurmctld "
            f"{mem['slurmctld_rss_mib']} MiB RSS included; other work on the host moves it "
            f"too). Host: {mem['host_total_gib']} GiB, {mem['host_available_gib']} GiB "
            "available with the cluster up.",
        ]
    checks = result.get("checks") or {}
    frozen, killed = checks.get("frozen_slurmd"), checks.get("killed_slurmd")
    if frozen or killed:
        lines += [
            "",
            f"## A frozen and a killed slurmd among {result.get('checks_nodes')} nodes",
            "",
        ]
    if frozen:
        lines.append(
            f"- slurmd SIGSTOPped: SYN probes {frozen['syn']}, connect {frozen['connect']}."
        )
    if killed:
        lines.append(
            f"- slurmd SIGKILLed: unreachable ({killed['detail']}) "
            f"{killed['unreachable_after_s']} s after the kill (SYN, 1 s, failures=3); other "
            f"nodes called unreachable: {killed['others_unreachable'] or 'none'}."
        )
    lines += [
        "",
        "What the simulated nodes stand for: to a SYN probe a listening socket is all there is "
        "to a slurmd (its kernel answers, the process never sees it), so those rows are the "
        "real protocol. To a connect probe they are the real TCP handshake and close, but "
        "slurmd also reads the empty connection and logs two lines; only the real slurmds' "
        "column says what a probe costs a node. Relaunch has no authenticated (munge RPC) "
        "probe; one would cost both sides more and is not measured.",
        "",
        "Raw numbers: [probe_scale.json](probe_scale.json).",
        "",
    ]
    return "\n".join(lines)


# ---------------------------------------------------------------------- main


async def run(args: argparse.Namespace) -> tuple[list[Window], dict[str, Any]]:
    work = Path(tempfile.mkdtemp(prefix="relaunch-probe-cost-"))
    layout = slurm_layout(work, args.nodes)
    windows: list[Window] = []
    checks: dict[str, Any] = {}
    try:
        log(f"starting a private Slurm: munged, slurmctld, {args.nodes} slurmd under {work}")
        t0 = time.monotonic()
        await asyncio.to_thread(start_cluster, layout)
        log(f"{args.nodes} nodes idle after {time.monotonic() - t0:.1f}s; settling 5s")
        await asyncio.sleep(5)
        targets = [
            ProbeTarget(node, "127.0.0.1", port)
            for node, port in zip(layout.nodes, layout.slurmd_ports, strict=True)
        ]
        plan: list[tuple[str, Prober | None]] = [("idle", None)]
        if raw_sockets_permitted():
            plan.append(("syn", MarkedSyn()))
        else:
            log("raw sockets are not permitted: the SYN window is skipped (run as root)")
        plan.append(("connect", MarkedConnect()))
        for name, prober in plan:
            log(f"window {name}: {args.seconds:g}s")
            w = await measure(name, layout, targets, prober, args)
            windows.append(w)
            log(
                f"  {name}: probe CPU {w.probe_cpu_s_per_s:.4f} s/s, {w.probes_per_s:.1f} probes/s,"
                f" rounds p50 {w.round_p50_ms:.2f} ms p95 {w.round_p95_ms:.2f} ms; per slurmd "
                f"{w.slurmd_accepted_per_s_per_node:.3f} conns/s, "
                f"{w.slurmd_log_lines_per_s_per_node:.3f} log lines/s; slurmd CPU (all) "
                f"{w.slurmd_cpu_s_per_s_all:.4f} s/s; outcomes {w.outcomes}"
            )
        if raw_sockets_permitted() and len(targets) >= 2:
            log("frozen (SIGSTOP) and killed (SIGKILL) slurmd")
            checks = await semantics(layout, targets)
            log(f"  {checks}")
    finally:
        log("tearing the private Slurm down")
        try:
            stopped = await asyncio.to_thread(stop_cluster, work, layout)
            log(f"stopped {stopped} processes")
        finally:
            if not args.keep:
                shutil.rmtree(work, ignore_errors=True)
    return windows, checks


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nodes", type=int, default=64)
    p.add_argument("--seconds", type=float, default=60.0)
    p.add_argument("--interval", type=float, default=1.0)
    p.add_argument("--timeout", type=float, default=1.0)
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    p.add_argument("--keep", action="store_true", help="keep the cluster's files (logs)")
    p.add_argument(
        "--sizes",
        type=_sizes,
        default=None,
        help="comma-separated node counts (e.g. 64,256,500,1000): measure one round at each, "
        "with --real real slurmds and simulated nodes beyond; writes probe_scale.json/.md",
    )
    p.add_argument(
        "--real",
        type=int,
        default=256,
        help="with --sizes: how many real slurmds to start (default 256)",
    )
    args = p.parse_args(argv)
    if not 1 <= args.nodes <= MAX_NODES:
        p.error(f"--nodes must be 1..{MAX_NODES}")
    if not 1 <= args.real <= MAX_NODES:
        p.error(f"--real must be 1..{MAX_NODES}")
    if not 1 <= args.seconds <= MAX_SECONDS:
        p.error(f"--seconds must be 1..{MAX_SECONDS}")
    return args


def _sizes(text: str) -> list[int]:
    try:
        sizes = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a list of node counts: {text!r}") from None
    if not 1 <= len(sizes) <= MAX_SIZES or not all(2 <= n <= MAX_TARGETS for n in sizes):
        raise argparse.ArgumentTypeError(
            f"1 to {MAX_SIZES} node counts, each 2..{MAX_TARGETS}: {text!r}"
        )
    return sorted(set(sizes))


def main_scale(args: argparse.Namespace, started: str) -> int:
    try:
        result = asyncio.run(run_scale(args))
    except RelaunchError as exc:
        print(f"probe_cost: {exc}", file=sys.stderr)
        return 1
    args.out.mkdir(parents=True, exist_ok=True)
    data = {
        "started": started,
        "sizes": args.sizes,
        "seconds": args.seconds,
        "interval_s": args.interval,
        "timeout_s": args.timeout,
        **{k: v for k, v in result.items() if k != "windows"},
        "windows": [asdict(w) for w in result["windows"]],
    }
    (args.out / "probe_scale.json").write_text(json.dumps(data, indent=2) + "\n")
    text = report_scale(result, args, started)
    (args.out / "probe_scale.md").write_text(text)
    print(text)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC"
    if args.sizes:
        return main_scale(args, started)
    try:
        windows, checks = asyncio.run(run(args))
    except RelaunchError as exc:
        print(f"probe_cost: {exc}", file=sys.stderr)
        return 1
    args.out.mkdir(parents=True, exist_ok=True)
    data = {
        "started": started,
        "nodes": args.nodes,
        "seconds": args.seconds,
        "interval_s": args.interval,
        "timeout_s": args.timeout,
        "slurm_ping_per_s_per_node_default": 1 / 100,
        "windows": [asdict(w) for w in windows],
        "checks": checks,
    }
    (args.out / "probe_cost.json").write_text(json.dumps(data, indent=2) + "\n")
    text = report(windows, checks, args, started)
    (args.out / "probe_cost.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
