"""`make demo`: the recovery story on the local stack, end to end and for real.

1. bring the stack up: Temporal, PostgreSQL, a 4-node Slurm, the Relaunch worker and watcher;
2. submit the PyTorch DDP example (2 nodes, gloo) and let it write a checkpoint;
3. kill one of its nodes (slurmd and the job's processes there) and write the Xid 79 line a dying
   GPU prints into that node's kernel-log source;
4. Relaunch detects it, attributes it, and — in monitor mode — recommends a plan and waits (the
   failed node's decision, which the job's recovery joined: one approval covers every job the
   node took down);
5. approve from the CLI; Relaunch drains the node, requeues the job without it, and verifies the
   job runs on healthy nodes and resumes from its checkpoint;
6. print the incident's timeline; leave the stack running.
"""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter

from relaunch.connectors.slurm.commands import SlurmCli
from relaunch.devstack import faults
from relaunch.devstack.stack import Stack
from relaunch.devstack.workload import submit_training
from relaunch.models.errors import RelaunchError
from relaunch.models.lifecycle import reservation_name
from relaunch.models.recovery import (
    RELAUNCH_REASONS,
    TERMINAL_STAGES,
    RecoveryStatus,
    Stage,
    recovery_workflow_id,
)
from relaunch.models.scheduler import Job, JobState
from relaunch.workflows.recovery import RecoveryWorkflow

ROOT = Path(__file__).resolve().parent.parent
STATE = ROOT / ".relaunch"
RELAUNCH = [sys.executable, "-m", "relaunch.cli"]
STEP_LINE = r"step=\d+ loss"


def say(text: str) -> None:
    print(f"[{datetime.now():%H:%M:%S}] {text}", flush=True)


async def wait_job(sched: SlurmCli, job_id: str, state: JobState, timeout: float) -> Job:
    deadline = time.monotonic() + timeout
    while True:
        job = await sched.get_job(job_id)
        if job.state is state:
            return job
        if time.monotonic() > deadline:
            raise RelaunchError(
                f"job {job_id} is {job.state.value} ({job.reason}), not {state.value}"
            )
        await asyncio.sleep(0.3)


async def wait_log(path: Path, pattern: str, timeout: float = 120) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = path.read_text(errors="replace") if path.exists() else ""
        found = re.findall(rf"^.*{pattern}.*$", text, flags=re.M)
        if found:
            return found[-1]
        await asyncio.sleep(0.3)
    raise RelaunchError(f"no line matching {pattern!r} in {path}")


async def wait_stage(
    client: Client, incident: str, stages: set[Stage], timeout: float
) -> RecoveryStatus:
    handle = client.get_workflow_handle_for(RecoveryWorkflow.run, incident)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            status = await handle.query(RecoveryWorkflow.status)
        except Exception:  # not started yet
            await asyncio.sleep(0.3)
            continue
        if status.stage in stages or status.stage in TERMINAL_STAGES:
            return status
        if Stage.AWAITING_APPROVAL in stages and status.awaiting_approval:
            return status  # its node decision awaits the approval, for every job it covers
        await asyncio.sleep(0.3)
    raise RelaunchError(f"incident {incident} did not reach {sorted(stages)} in {timeout:.0f}s")


async def tidy(stack: Stack, sched: SlurmCli, client: Client) -> None:
    """Undo an earlier demo: its job, its nodes' lifecycles, and the nodes Relaunch drained."""
    for job in await sched.list_jobs():
        if job.name == "train-ddp" and job.state.is_active:
            await sched.cancel_job(job.job_id)
            say(f"cancelled job {job.job_id}, left running by an earlier demo")
    cluster = stack.cluster_config().name
    query = (
        f'WorkflowType="NodeLifecycleWorkflow" AND ExecutionStatus="Running" AND '
        f'RelaunchCluster="{cluster}"'
    )
    async for wf in client.list_workflows(query):
        await client.get_workflow_handle(wf.id).terminate("an earlier demo's: tidied up")
        say(f"ended {wf.id}, left waiting by an earlier demo")
    maint = sched.maintenance()
    for node in await sched.list_nodes():
        await maint.unreserve_node(reservation_name(node.name))
        if node.reason.startswith(RELAUNCH_REASONS):
            await sched.resume_node(node.name)
            say(f"resumed {node.name}, drained by an earlier demo")


async def story(stack: Stack) -> None:
    sched = stack.scheduler()
    cluster = stack.cluster_config()
    client = await Client.connect(stack.temporal_address, data_converter=pydantic_data_converter)
    await tidy(stack, sched, client)
    work = STATE / "demo"
    work.mkdir(parents=True, exist_ok=True)
    job_id = submit_training(
        stack.slurm_env,
        workdir=work,
        args=["--step-sleep", "0.2", "--ckpt-every", "10"],
    )
    log = work / f"train-{job_id}.out"
    say(f"submitted the DDP example as job {job_id} (2 nodes, gloo, checkpoint every 10 steps)")
    job = await wait_job(sched, job_id, JobState.RUNNING, 60)
    say(f"job {job_id} RUNNING on {', '.join(job.nodes)}; log {log}")
    print(f"    {await wait_log(log, r'checkpoint saved step=')}")

    culprit = job.nodes[-1]
    kernel_log = Path(cluster.node_log_pattern.format(node=culprit))  # type: ignore[union-attr]
    killed = faults.kill_node(stack.slurm, culprit, job_id=job_id, kernel_log=kernel_log)
    fault_at = time.monotonic()
    say(
        f"FAULT: killed {culprit}'s slurmd and the job's processes there ({killed} processes); "
        f"wrote an Xid 79 line to {kernel_log}"
    )

    incident = recovery_workflow_id(cluster.name, job_id, job.restart_count)
    status = await wait_stage(client, incident, {Stage.AWAITING_APPROVAL}, 120)
    say(
        f"Relaunch recommends ({time.monotonic() - fault_at:.1f}s after the fault): "
        f"incident {incident}"
    )
    if status.verdict:
        print(
            f"    verdict: {status.verdict.category.value} on "
            f"{', '.join(status.verdict.culprit_nodes) or '-'} "
            f"(confidence {status.verdict.confidence:.2f}) — {status.verdict.summary}"
        )
    if status.node_decision:
        print(
            f"    node decision {status.node_decision}: drain "
            f"{', '.join(status.node_decisions) or '-'} and requeue the jobs it took down "
            f"(covers {status.covers} job{'' if status.covers == 1 else 's'} so far)"
        )
    if status.plan:
        print(
            f"    plan: {status.plan.action.value}, "
            f"drain {','.join(status.plan.drain_nodes) or '-'}, "
            f"restart by {status.plan.restart_method.value}; mode {status.plan.mode.value}"
        )
    if not status.awaiting_approval:
        raise RelaunchError(f"incident ended as {status.stage.value}: {status.outcome}")

    cmd = [
        *RELAUNCH,
        "approve",
        incident,
        "--by",
        "demo-operator",
        "--reason",
        "demo",
        "--config",
        str(stack.cluster_config_path),
    ]
    say("approving from the CLI: relaunch approve " + incident + " --by demo-operator")
    subprocess.run(cmd, check=True)
    final = await wait_stage(client, incident, {Stage.DONE}, 240)
    if final.stage is not Stage.DONE:
        raise RelaunchError(f"incident ended as {final.stage.value}: {final.outcome}")
    say(f"recovered: {final.outcome}")
    print(f"    {await wait_log(log, r'resumed from checkpoint step=')}")
    print(f"    {await wait_log(log, STEP_LINE)}")

    print()
    subprocess.run(
        [*RELAUNCH, "show", incident, "--config", str(stack.cluster_config_path)], check=True
    )
    node = await sched.get_node(culprit)
    print(f"\nnode {culprit}: {node.display_state}, reason {node.reason!r}")


def main() -> int:
    stack = Stack(STATE)
    try:
        say("bringing up the local stack (Temporal, PostgreSQL, 4-node Slurm, worker, watcher)")
        stack.up(progress=lambda msg: print(f"    … {msg}", flush=True))
        asyncio.run(story(stack))
    except (RelaunchError, subprocess.CalledProcessError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print()
    print("The stack is still running. Explore it:")
    print(f"  export SLURM_CONF={stack.slurm.conf}")
    print(f"  export TEMPORAL_ADDRESS={stack.temporal_address}")
    print(f"  export PATH={Path(sys.executable).parent}:$PATH")
    print("  sinfo -R; squeue; relaunch incidents; temporal workflow list")
    print(f"  Temporal UI: {stack.temporal_ui}")
    print(
        "  (the failed node is now its lifecycle's: `relaunch nodes` shows its stage; in monitor "
        "mode it asks first:\n   `relaunch approve <its lifecycle, named above> --by you` to "
        "reserve it and run its checks,\n   again to reboot it (restart its slurmd), and again "
        "before returning it: docs/lifecycle.md)"
    )
    print("Stop everything: .venv/bin/relaunch dev down   (or: make down)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
