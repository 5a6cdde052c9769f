"""One real fault injection per class, against the DDP example on a private local stack, and
what Relaunch made of it (from the job's log, Slurm, the workflow and the audit trail).

Every class: the 2-node DDP job (rank r on the job's r-th node) runs until it has checkpointed
(every 10 steps) and passed step 15; then the fault hits rank 1's node (the culprit).

The silent classes print no error line: the survivors block in their next all-reduce (gloo
keeps waiting on a peer whose sockets stay open) for the job's 1800 s process-group timeout."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import socket
import subprocess
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psutil
from temporalio.client import Client

from bench.faults.common import BenchError, BenchStack, JobWatch, LogTail, log, now, submit_ddp
from relaunch.connectors.audit import AuditStore
from relaunch.devstack import faults
from relaunch.models.errors import RelaunchError
from relaunch.models.recovery import RecoveryStatus, recovery_workflow_id
from relaunch.workflows.recovery import RecoveryWorkflow

TRAIN_ARGS = ["--step-sleep", "0.2", "--ckpt-every", "10", "--pg-timeout", "60"]
# Silent classes: a survivor blocked in a collective stays silent for 30 min, as on a cluster
# whose NCCL/gloo timeout is long (PyTorch's default NCCL timeout is 10 min, Megatron's 30).
SILENT_ARGS = ["--step-sleep", "0.2", "--ckpt-every", "10", "--pg-timeout", "1800"]
EPOCH = datetime(2000, 1, 1, tzinfo=UTC)
FAULT_AFTER_STEP = 15
APP_FAIL_STEP = 16

# Mix A of docs/failure-signatures.md §4, the classes this benchmark injects (infrastructure
# software and storage, 15 %, are not injected: no real fault of theirs can be made on this
# machine).
MIX = {
    "gpu_hardware": 40,
    "network": 15,
    "node_failure": 9,
    "hang": 8,
    "application": 9,
    "preemption": 10,
}
# What Relaunch should do: (category, action, drains the culprit)
EXPECTED: dict[str, tuple[str, str, bool]] = {
    "gpu_hardware": ("gpu_hardware", "isolate_and_restart", True),
    "network": ("network", "isolate_and_restart", True),
    "node_failure": ("node_failure", "isolate_and_restart", True),
    # The stopped rank's node is the culprit: draining it is right (isolate and restart), and
    # so is a restart without a drain when the evidence names no rank (report.false_drains).
    "hang": ("hang", "restart", True),
    "application": ("application", "hold", False),
    "preemption": ("preemption", "none", False),
}
# Faults that print no error line (the commonest real deaths): injected beside Mix A, not
# weighted by it (they are Mix A's node failures, hangs and network faults seen from outside).
SILENT = ("silent_node_crash", "silent_hang", "network_partition")
CLASSES = (*MIX, *SILENT)
EXPECTED.update(
    {
        # The probe finds the dead slurmd: a trusted node_unreachable names the culprit.
        "silent_node_crash": ("node_failure", "isolate_and_restart", True),
        # Under the default hang policy (no bench override of the floor).
        "silent_hang": ("hang", "restart", True),
        "network_partition": ("node_failure", "isolate_and_restart", True),
    }
)
# Other verdicts that are also right for a class (category/action).
ALSO_RIGHT: dict[str, set[str]] = {
    "hang": {"hang/isolate_and_restart"},
    "silent_hang": {"hang/isolate_and_restart"},
    "network_partition": {"network/isolate_and_restart"},
}
EXPLICIT = ("gpu_hardware", "network", "node_failure", "application", "preemption")
# A line a survivor prints when it notices a dead peer (gloo, srun, slurmstepd, Python).
ERROR_LINE = re.compile(r"error|Error|ERROR|Traceback|Terminated|CANCELLED|timed out|abort")
Injector = Callable[[BenchStack, str, str, LogTail], Awaitable[dict[str, Any]]]


def rank_processes(bs: BenchStack, node: str, job_id: str) -> list[psutil.Process]:
    """The DDP rank processes of this job on ``node`` (faults.rank_processes)."""
    return faults.rank_processes(bs.s.slurm, node, job_id)


async def inject_gpu(bs: BenchStack, job_id: str, node: str, tail: LogTail) -> dict[str, Any]:
    """Xid 79 in the node's kernel-log source while the rank on it dies (SIGKILL); slurmd lives."""
    ranks = rank_processes(bs, node, job_id)
    path = bs.node_log(node)
    with open(path, "a") as fh:
        fh.write(faults.xid79_line(node, pid=ranks[0].pid if ranks else 4242))
    for proc in ranks:
        with contextlib.suppress(psutil.Error):
            proc.send_signal(signal.SIGKILL)
    return {"killed": len(ranks)}


async def inject_node(bs: BenchStack, job_id: str, node: str, tail: LogTail) -> dict[str, Any]:
    """The node's slurmd and the job's processes on it SIGKILLed; no log line is written."""
    killed = faults.kill_node(bs.s.slurm, node, job_id=job_id)
    return {"killed": killed, "struck_at": now()}


def cut_connections(proc: psutil.Process) -> int:
    """Destroy every established TCP socket of ``proc`` with ``ss -K`` (the kernel's
    sock_destroy: the process gets ECONNABORTED, its peer a reset). Returns how many went."""
    cut = 0
    for conn in proc.net_connections(kind="tcp"):
        if conn.status != psutil.CONN_ESTABLISHED or not conn.raddr:
            continue
        argv = [
            "ss", "-K", "src", conn.laddr.ip, "sport", "=", f":{conn.laddr.port}",
            "dst", conn.raddr.ip, "dport", "=", f":{conn.raddr.port}",
        ]  # fmt: skip
        result = subprocess.run(argv, capture_output=True, text=True, timeout=10, check=False)
        if result.returncode == 0 and f":{conn.laddr.port}" in result.stdout:
            cut += 1
    return cut


async def inject_network(bs: BenchStack, job_id: str, node: str, tail: LogTail) -> dict[str, Any]:
    """Rank 1's TCP connections (gloo and the c10d store) cut for real with ``ss -K``."""
    ranks = rank_processes(bs, node, job_id)
    cut = sum(cut_connections(p) for p in ranks)
    if not cut:
        raise BenchError("ss -K cut no connection (kernel without sock_destroy?)")
    return {"connections_cut": cut}


async def inject_hang(bs: BenchStack, job_id: str, node: str, tail: LogTail) -> dict[str, Any]:
    """Rank 1's python process stopped with SIGSTOP (it stays alive, silent, holding its
    sockets; rank 0 blocks in the next all-reduce)."""
    ranks = rank_processes(bs, node, job_id)
    for proc in ranks:
        proc.send_signal(signal.SIGSTOP)
    return {"stopped": [p.pid for p in ranks]}


async def inject_app(bs: BenchStack, job_id: str, node: str, tail: LogTail) -> dict[str, Any]:
    """Nothing to do here: the job was submitted with --fail-at-step; the fault time is when
    the rank's exception reached the log."""
    await tail.wait(
        lambda t: t.first("injected application error", EPOCH) is not None,
        "the injected application error",
        60,
    )
    return {}


async def inject_preemption(
    bs: BenchStack, job_id: str, node: str, tail: LogTail
) -> dict[str, Any]:
    """A job in the higher-PriorityTier partition `urgent` that needs the culprit node whole:
    Slurm preempts (requeues) the DDP job for it."""
    out = subprocess.run(
        [
            "sbatch",
            "--parsable",
            "--partition=urgent",
            "--exclusive",
            f"--nodelist={node}",
            "--job-name=urgent",
            "--output=/dev/null",
            "--wrap",
            "sleep 20",
        ],  # fmt: skip
        env={**os.environ, **bs.s.slurm_env},
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    if out.returncode != 0:
        raise BenchError(f"urgent job not submitted: {out.stderr.strip()}")
    return {"urgent_job": out.stdout.strip().split(";")[0]}


async def inject_freeze(bs: BenchStack, job_id: str, node: str, tail: LogTail) -> dict[str, Any]:
    """`faults.freeze_node`: the node's slurmd SIGKILLed, its slurmstepd and rank SIGSTOPped
    (sockets open and silent: the survivor blocks). Records whether slurmd's port refuses."""
    frozen = faults.freeze_node(bs.s.slurm, node, job_id=job_id)
    struck = now()  # the processes are found first (a /proc scan), then signalled at once
    await asyncio.sleep(0.2)
    return {"frozen": frozen, "slurmd_port": slurmd_port_state(bs, node), "struck_at": struck}


async def inject_partition(bs: BenchStack, job_id: str, node: str, tail: LogTail) -> dict[str, Any]:
    """`faults.partition_ports`: every packet of the job's processes on the node (rank 1's gloo
    and store connections, slurmstepd's) and of the node's slurmd port silently dropped
    (nftables, both directions, no reset)."""
    procs = faults.job_processes_with_stepds(bs.s.slurm, node, job_id)
    table = f"rlbench_{bs.name}_{job_id}"
    part = faults.partition_ports(bs.s.slurm, node, procs, table=table)
    struck = now()
    return {
        "struck_at": struck,
        "nft_table": part.table,
        "dropped_ports": list(part.ports),
        "slurmd_port": slurmd_port_state(bs, node),
    }


def slurmd_port_state(bs: BenchStack, node: str) -> str:
    """What a connection to the node's slurmd port gets now: open, refused or no answer."""
    port = bs.s.slurm.slurmd_ports[bs.s.slurm.nodes.index(node)]
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1.0):
            return "open"
    except ConnectionRefusedError:
        return "refused"
    except OSError:
        return "no answer"


def undo_injection(info: dict[str, Any]) -> None:
    """Take back what an injection left: the partition's rules (always first), frozen
    processes (SIGKILLed). Idempotent."""
    if table := info.get("nft_table"):
        try:
            faults.heal_partition(str(table))
        except RelaunchError as exc:
            log(f"nft table {table} not removed: {exc}")
    if frozen := info.get("frozen"):
        faults.release_frozen(list(frozen))


def silence(tail: LogTail, at: datetime) -> dict[str, Any]:
    """How long the job log stayed free of error-looking lines after ``at``: any line (srun's
    and slurmstepd's too) and the survivor's (rank 0's, ``0: `` under ``srun -l``); None where
    there was none in what was observed."""
    found = tail.first(ERROR_LINE, at)
    # The rank's own lines, not slurmstepd's (which srun -l labels with the task too).
    survivor = tail.first(re.compile(r"^0: (?!slurmstepd).*(?:" + ERROR_LINE.pattern + ")"), at)
    return {
        "first_error_s": (found[0] - at).total_seconds() if found else None,
        "first_error_line": found[1][:160] if found else None,
        "survivor_error_s": (survivor[0] - at).total_seconds() if survivor else None,
    }


INJECTORS: dict[str, Injector] = {
    "gpu_hardware": inject_gpu,
    "network": inject_network,
    "node_failure": inject_node,
    "hang": inject_hang,
    "application": inject_app,
    "preemption": inject_preemption,
    "silent_node_crash": inject_freeze,
    "silent_hang": inject_hang,
    "network_partition": inject_partition,
}


def train_args(cls: str) -> list[str]:
    """The DDP example's arguments for a class's job."""
    if cls in SILENT:
        return list(SILENT_ARGS)
    args = list(TRAIN_ARGS)
    if cls == "application":
        args += ["--fail-at-step", str(APP_FAIL_STEP), "--fail-rank", "1"]
    return args


async def workflow_result(client: Client, incident: str, timeout: float) -> RecoveryStatus | None:
    """The recovery's final status, or None when it did not start or end within ``timeout``."""
    handle = client.get_workflow_handle_for(RecoveryWorkflow.run, incident)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            return await asyncio.wait_for(handle.result(), max(1.0, deadline - time.monotonic()))
        except TimeoutError:
            break
        except Exception:  # not started yet
            await asyncio.sleep(0.5)
    with contextlib.suppress(Exception):
        return await handle.query(RecoveryWorkflow.status)
    return None


async def run_one(
    bs: BenchStack, client: Client, audit: AuditStore, cls: str, n: int, work: Path
) -> dict[str, Any]:
    sched = bs.sched()
    args = train_args(cls)
    job_id = await asyncio.to_thread(
        submit_ddp,
        bs,
        workdir=work,
        ckpt_dir=work / f"ckpt-{cls}-{n}",
        args=args,
        port=21000 + n * 10 + CLASSES.index(cls),
    )
    tail = LogTail(work / f"train-{job_id}.out")
    tail.start()
    watch = JobWatch(sched, job_id)
    row: dict[str, Any] = {"cls": cls, "run": n, "job": job_id}
    urgent: str | None = None
    info: dict[str, Any] = {}
    try:
        await tail.wait(
            lambda t: t.last_checkpoint() >= 10 and t.max_step() >= FAULT_AFTER_STEP - 1,
            f"job {job_id} checkpoint and step {FAULT_AFTER_STEP - 1}",
            180,
        )
        job = await sched.get_job(job_id)
        nodes = sorted(job.nodes)
        culprit = nodes[1]
        before = job.restart_count
        watch.start()
        fault_at = now()
        info = await INJECTORS[cls](bs, job_id, culprit, tail)
        # The moment the fault struck, where finding its processes took a while first.
        fault_at = info.pop("struck_at", fault_at)
        if cls == "application":
            found = tail.first("injected application error", EPOCH)
            fault_at = found[0] if found else fault_at
        urgent = info.get("urgent_job")
        shown = {k: v for k, v in info.items() if k != "urgent_job"}
        row.update(culprit=culprit, job_nodes=nodes, fault_at=fault_at.isoformat(), **shown)
        step_at_fault = tail.max_step(fault_at)
        incident = recovery_workflow_id(bs.cfg.name, job_id, before)
        limit = 90 if cls in ("application", "preemption") else 240
        status = await workflow_result(client, incident, limit)
        row["stage"] = status.stage.value if status else "not started"
        row["category"] = status.verdict.category.value if status and status.verdict else "-"
        row["action"] = status.verdict.action.value if status and status.verdict else "-"
        row["culprits"] = status.verdict.culprit_nodes if status and status.verdict else []
        drained = {n.name for n in await sched.list_nodes() if n.drain_flag}
        events = await audit.events(incident)
        detections = [e for e in events if e.kind == "detection"]
        if detections:
            first = min(
                detections, key=lambda e: datetime.fromisoformat(str(e.data["detected_at"]))
            )
            det_at = datetime.fromisoformat(str(first.data["detected_at"]))
            row["detect_s"] = (det_at - fault_at).total_seconds()
            row["detection_kind"] = str(first.data.get("kind") or first.summary)[:60]
            decided = [e for e in events if e.kind in ("verdict", "plan")]
            actions = [e for e in events if e.kind == "action"]
            if decided:
                row["decide_s"] = (min(e.at for e in decided) - det_at).total_seconds()
            if actions:
                row["action_s"] = (min(e.at for e in actions) - det_at).total_seconds()
                row["first_action"] = str(actions[0].data.get("step", actions[0].summary))[:40]
        row["event_kinds"] = sorted({e.kind for e in events})
        expected_drain = {culprit} if EXPECTED[cls][2] else set()
        row["drained"] = sorted(drained)
        row["right_drain"] = (culprit in drained) if expected_drain else (not drained)
        row["false_drains"] = sorted(drained - expected_drain)
        # Running again and the first training step after the resume (when the job restarts).
        # Only a recovery that restarted the job (or Slurm's own requeue after a preemption)
        # brings it back; a hold or no action leaves nothing to wait for.
        restarts = cls == "preemption" or row["action"] in ("restart", "isolate_and_restart")
        if restarts and row["stage"] not in ("not started", "held", "failed"):
            with contextlib.suppress(BenchError):
                await tail.wait(
                    lambda t: t.resume(fault_at)[1] is not None, "first step after resume", 150
                )
        running = watch.running_again(fault_at, before)
        ckpt, first_step = tail.resume(fault_at)
        if running:
            row["running_s"] = (running - fault_at).total_seconds()
        if first_step:
            row["first_step_s"] = (first_step - fault_at).total_seconds()
        if ckpt is not None:
            row["work_lost"] = step_at_fault - ckpt
        else:
            row["work_lost_since_ckpt"] = step_at_fault - tail.last_checkpoint()
        row["step_at_fault"] = step_at_fault
        row["progress"] = [((t - fault_at).total_seconds(), s) for t, s in tail.progress()]
        row.update(silence(tail, fault_at))
    except (BenchError, RelaunchError) as exc:
        row["error"] = str(exc)[:400]
        log(f"{cls} run {n}: {exc}")
    finally:
        undo_injection(info)
        await watch.stop()
        await tail.stop()
        for proc in rank_processes(bs, row.get("culprit", ""), job_id) if "culprit" in row else []:
            with contextlib.suppress(psutil.Error):
                proc.send_signal(signal.SIGCONT)
        for j in (job_id, urgent):
            if j:
                with contextlib.suppress(RelaunchError):
                    await sched.cancel_job(j)
        await bs.restore_nodes()
        await bs.wait_idle()
    log(
        f"{cls} run {n}: job {job_id} → {row.get('stage')} {row.get('category')}/"
        f"{row.get('action')} det {row.get('detect_s', float('nan')):.2f}s act "
        f"{row.get('action_s', float('nan')):.2f}s running "
        f"{row.get('running_s', float('nan')):.1f}s"
        f" drained {row.get('drained')} events {row.get('event_kinds')}"
    )
    return row
