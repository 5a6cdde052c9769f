"""Fault injection on the local cluster, for the demo, the tests and the benchmarks.

A "node failure" here is what it looks like from the outside on a real cluster: the node's
slurmd stops answering and the job's processes on it vanish; optionally the node's kernel-log
source gets the line a dying GPU prints (Xid 79, "GPU has fallen off the bus")."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from datetime import UTC, datetime
from pathlib import Path

import psutil

from relaunch.devstack.slurm import SlurmLayout, slurmd_pid


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
    """The job processes (slurmstepd and below) that run "on" ``node`` of this cluster."""
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
