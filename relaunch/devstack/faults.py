"""Fault injection on the local cluster, for the demo, the tests and the benchmarks.

A "node failure" here is what it looks like from the outside on a real cluster: the node's
slurmd stops answering and the job's processes on it vanish; optionally the node's kernel-log
source gets the line a dying GPU prints (Xid 79, "GPU has fallen off the bus"). Silent faults:
a node frozen in place (:func:`freeze_node`) and a node cut off the network by dropped packets
(:func:`partition_ports`)."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import psutil

from relaunch.devstack.slurm import SlurmLayout, slurmd_pid
from relaunch.models.errors import StackError

_TABLE = re.compile(r"[a-z][a-z0-9_]{0,40}")
# In a node's folder (``<cluster>/nodes/<node>/``): the GPU fault the dev cluster's `dev-gpu`
# health check sees (see ``Stack.lifecycle_settings``). A real GPU's fault outlives a restart
# of slurmd, and so does this marker: only ``clear_gpu_fault`` (the "repair") removes it.
GPU_FAULT_MARKER = "gpu-fault"


def xid79_line(node: str, when: datetime | None = None, pid: int = 4242) -> str:
    """A kernel-log line as rsyslog writes it (RFC 3339 time), with NVRM's Xid 79 message."""
    when = when or datetime.now(UTC)
    uptime = time.monotonic()
    return (
        f"{when.isoformat(timespec='microseconds')} {node} kernel: [{uptime:12.6f}] NVRM: Xid "
        f"(PCI:0000:3b:00): 79, pid={pid}, name=python3, GPU has fallen off the bus.\n"
    )


def _environ(proc: psutil.Process) -> dict[str, str]:
    try:
        return proc.environ()
    except (psutil.Error, OSError):
        return {}


def job_processes(
    layout: SlurmLayout, node: str, job_id: str | None = None
) -> list[psutil.Process]:
    """The job's processes (its tasks and what they start) that run "on" ``node`` of this
    cluster: those whose environment names the node (and the job). Not the slurmstepd above
    them, whose environment is slurmd's: see :func:`job_processes_with_stepds`."""
    conf = str(layout.conf)
    found = []
    for proc in psutil.process_iter(["pid"]):
        env = _environ(proc)
        if env.get("SLURM_CONF") != conf:
            continue
        on_node = env.get("SLURMD_NODENAME") == node
        if on_node and (job_id is None or env.get("SLURM_JOB_ID") == job_id):
            found.append(proc)
    return found


def rank_processes(
    layout: SlurmLayout, node: str, job_id: str | None = None
) -> list[psutil.Process]:
    """The job's training processes on ``node`` (the example's ranks): ``train_ddp.py`` run by
    srun or torchrun's CLI (not the torchrun agent, whose command line names the script too),
    or a worker examples/elastic_launch.py forked from its agent (same command line as its
    parent)."""
    found = []
    for proc in job_processes(layout, node, job_id):
        try:
            argv = proc.cmdline()
            if any(a.endswith("elastic_launch.py") for a in argv):
                parent = proc.parent()
                if parent is not None and parent.cmdline() == argv:
                    found.append(proc)
            elif any("train_ddp.py" in a for a in argv) and "torch.distributed.run" not in argv:
                found.append(proc)
        except psutil.Error:
            continue
    return found


def node_processes(layout: SlurmLayout, node: str, job_id: str | None = None) -> list[int]:
    """The pids :func:`kill_node` kills: the node's slurmd and its (or one job's) processes.
    Finding them scans /proc, which takes a while with thousands of processes."""
    victims: list[int] = []
    pid = slurmd_pid(layout, node)
    if pid:
        victims.append(pid)
    return victims + [p.pid for p in job_processes(layout, node, job_id)]


def kill_pids(node: str, victims: list[int], *, kernel_log: Path | None = None) -> int:
    """SIGKILL ``victims`` at once, then append an Xid 79 line to ``node``'s kernel-log source
    when given. Returns how many processes were killed."""
    for v in victims:
        with contextlib.suppress(ProcessLookupError):
            os.kill(v, signal.SIGKILL)
    if kernel_log is not None:
        kernel_log.parent.mkdir(parents=True, exist_ok=True)
        with open(kernel_log, "a") as fh:
            fh.write(xid79_line(node))
    return len(victims)


def kill_node(
    layout: SlurmLayout, node: str, *, job_id: str | None = None, kernel_log: Path | None = None
) -> int:
    """Kill the node's slurmd and its job processes with SIGKILL; append an Xid 79 line to its
    kernel-log source when given. Returns how many processes were killed."""
    return kill_pids(node, node_processes(layout, node, job_id), kernel_log=kernel_log)


def freeze_node(layout: SlurmLayout, node: str, *, job_id: str | None = None) -> list[int]:
    """A node that vanished without a word (power loss, kernel panic): its slurmd SIGKILLed and
    the job's processes on it (slurmstepd and the ranks) stopped with SIGSTOP. Returns the
    stopped pids, for :func:`release_frozen`.

    The stopped processes keep their sockets open and never answer, so their peers get neither
    a FIN nor a reset and block in their next collective, as a powered-off node's peers do
    (SIGKILLed ranks on one machine close their sockets at once and the survivors raise).
    One difference remains: the dead slurmd's port refuses a connection at once (a reset from
    this machine's kernel), where a powered-off node's address does not answer at all and a
    connection attempt times out. Both read "unreachable" to a prober; only the time differs."""
    procs = job_processes_with_stepds(layout, node, job_id)
    # slurmstepd first: a stepd that saw its task stop would tell srun ("task stopped"), and
    # a powered-off node tells nobody anything.
    procs.sort(key=lambda p: not _is_stepd(p))
    frozen: list[int] = []
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            proc.send_signal(signal.SIGSTOP)
            frozen.append(proc.pid)
    daemon = slurmd_pid(layout, node)
    if daemon:
        with contextlib.suppress(ProcessLookupError):
            os.kill(daemon, signal.SIGKILL)
    return frozen


def _is_stepd(proc: psutil.Process) -> bool:
    try:
        return proc.name().startswith("slurmstepd")
    except psutil.Error:
        return False


def job_processes_with_stepds(
    layout: SlurmLayout, node: str, job_id: str | None = None
) -> list[psutil.Process]:
    """:func:`job_processes` and the slurmstepd above each of them: a slurmstepd inherits
    slurmd's environment, not the job's, so only its children name the job and the node."""
    procs = job_processes(layout, node, job_id)
    seen = {p.pid for p in procs}
    for proc in list(procs):
        with contextlib.suppress(psutil.Error):
            parent = proc.parent()
            if parent and parent.pid not in seen and _is_stepd(parent):
                procs.append(parent)
                seen.add(parent.pid)
    return procs


def release_frozen(pids: list[int]) -> int:
    """SIGKILL processes :func:`freeze_node` stopped (a stopped process dies of SIGKILL too),
    once Relaunch or Slurm has dealt with their node. Returns how many were still there."""
    gone = 0
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
            gone += 1
    return gone


@dataclass(frozen=True)
class Partition:
    """Silently dropped TCP ports (an nftables table of its own on this machine)."""

    table: str
    ports: tuple[int, ...]


def partition_ports(
    layout: SlurmLayout, node: str, procs: list[psutil.Process], *, table: str
) -> Partition:
    """``node`` falls off the fabric: every packet to or from the TCP ports of ``procs`` (the
    node's ranks and slurmstepd: gloo pairs, the c10d store, whatever they listen on) and of
    the node's slurmd port is dropped, in
    both directions, with no reset and no ICMP. Needs root and nftables (``nft``) with a kernel
    that has nf_tables. Established connections stall and time out; a new connection to the
    slurmd port is never answered.

    Not covered: connections slurmd or slurmstepd open later from new ephemeral ports (they
    still get through); on a real cluster the whole address goes dark."""
    if not _TABLE.fullmatch(table):
        raise ValueError(f"bad nftables table name {table!r}")
    ports = {layout.slurmd_ports[layout.nodes.index(node)]}
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            ports.update(c.laddr.port for c in proc.net_connections(kind="tcp") if c.laddr)
    plist = ", ".join(str(p) for p in sorted(ports))
    rules = "".join(
        f" chain {hook} {{ type filter hook {hook} priority -300; policy accept;"
        f" tcp sport {{ {plist} }} drop; tcp dport {{ {plist} }} drop; }}\n"
        for hook in ("input", "output")
    )
    _nft(["-f", "-"], f"table inet {table} {{\n{rules}}}\n")
    return Partition(table=table, ports=tuple(sorted(ports)))


def heal_partition(table: str) -> bool:
    """Delete the nftables table of a partition (idempotent). True when it was there."""
    if not _TABLE.fullmatch(table):
        raise ValueError(f"bad nftables table name {table!r}")
    if _nft(["list", "table", "inet", table], check=False).returncode != 0:
        return False
    _nft(["delete", "table", "inet", table])
    return True


def _nft(
    argv: list[str], stdin: str | None = None, *, check: bool = True
) -> subprocess.CompletedProcess[str]:
    try:
        out = subprocess.run(
            ["nft", *argv], input=stdin, capture_output=True, text=True, timeout=10, check=False
        )
    except FileNotFoundError as exc:
        raise StackError("nft not found: install nftables (apt-get install nftables)") from exc
    except subprocess.TimeoutExpired as exc:
        raise StackError(f"nft {' '.join(argv)} did not answer within 10 s") from exc
    if check and out.returncode != 0:
        raise StackError(f"nft {' '.join(argv)} failed: {out.stderr.strip()[-300:]}")
    return out


def mark_gpu_fault(node_dir: Path, text: str = "Xid 79: GPU has fallen off the bus") -> Path:
    """Mark the node's GPU broken for the dev cluster's `dev-gpu` check (``node_dir``: the
    node's folder, the parent of its kern.log)."""
    node_dir.mkdir(parents=True, exist_ok=True)
    marker = node_dir / GPU_FAULT_MARKER
    marker.write_text(text + "\n")
    return marker


def clear_gpu_fault(node_dir: Path) -> bool:
    """The GPU "repaired": remove the marker; whether there was one."""
    marker = node_dir / GPU_FAULT_MARKER
    existed = marker.exists()
    marker.unlink(missing_ok=True)
    return existed


def reboot_node(layout: SlurmLayout, node: str, *, wait_s: float = 30.0) -> None:
    """What a reboot is on the dev cluster: the node's slurmd stops (its job processes with
    it, as the machine's would) and starts again."""
    pid = slurmd_pid(layout, node)
    victims = [p.pid for p in job_processes(layout, node)]
    if pid:
        victims.append(pid)
    for v in victims:
        with contextlib.suppress(ProcessLookupError):
            os.kill(v, signal.SIGKILL)
    deadline = time.monotonic() + wait_s
    while pid and psutil.pid_exists(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    _start_slurmd(layout, node)
    # Back as a real machine comes back: registered and answering. slurmctld may ping the new
    # slurmd before it can answer, and then waits SlurmdTimeout/3 to ask again: a second start
    # registers it afresh.
    deadline = time.monotonic() + wait_s
    started = time.monotonic()
    while time.monotonic() < deadline:
        state = subprocess.run(
            ["sinfo", "-h", "-n", node, "-o", "%T"],
            env={**os.environ, **layout.env},
            capture_output=True,
            text=True,
            timeout=30,
        ).stdout.strip()
        if state and not state.endswith("*"):
            return
        if time.monotonic() - started > 5:
            restarted = slurmd_pid(layout, node)
            if restarted:
                os.kill(restarted, signal.SIGTERM)
                time.sleep(1)
            _start_slurmd(layout, node)
            started = time.monotonic()
        time.sleep(0.5)


def _start_slurmd(layout: SlurmLayout, node: str) -> None:
    if slurmd_pid(layout, node):
        return
    result = subprocess.run(
        ["slurmd", "-N", node, "-f", str(layout.conf)],
        capture_output=True,
        text=True,
        timeout=60,
        env=layout.process_env,  # the release's own slurmd (24.11's through its wrapper)
    )
    if result.returncode != 0:
        raise StackError(f"slurmd {node} did not start: {result.stderr.strip()[-300:]}")
