"""Polling helpers for tests against the real Slurm."""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

from temporalio.client import Client

from relaunch.connectors.slurm.commands import SlurmCli
from relaunch.devstack import faults
from relaunch.devstack.slurm import start_daemons
from relaunch.models.lifecycle import reservation_name
from relaunch.models.scheduler import Job, JobState

TRAIN_SCRIPT = """#!/bin/bash
#SBATCH --requeue
srun -l bash -c 'for i in $(seq 1 600); do echo "step $i node $SLURMD_NODENAME"; sleep 1; done'
"""


async def wait_job(sched: SlurmCli, job_id: str, state: JobState, timeout: float = 60.0) -> Job:
    """Poll until the job reaches ``state``; fail with what it was doing instead."""
    deadline = time.monotonic() + timeout
    job = await sched.get_job(job_id)
    while job.state is not state:
        if time.monotonic() > deadline:
            raise AssertionError(
                f"job {job_id} not {state.value} after {timeout:.0f}s: "
                f"{job.state.value} reason={job.reason} nodes={job.nodes}"
            )
        await asyncio.sleep(0.3)
        job = await sched.get_job(job_id)
    return job


async def restore_lifecycles(home: Any, sched: SlurmCli, name: str, client: Client) -> None:
    """Leave a cluster whose node lifecycles ran as found: the harness cluster's lifecycles
    ended, reservations gone, GPU-fault markers removed, slurmds back, nodes resumed."""
    async for wf in client.list_workflows(
        f'WorkflowType="NodeLifecycleWorkflow" AND RelaunchCluster="{name}" AND '
        'ExecutionStatus="Running"'
    ):
        with contextlib.suppress(Exception):
            await client.get_workflow_handle(wf.id).terminate("test over")
    start_daemons(home.slurm)
    maint = sched.maintenance()
    for node in home.slurm.nodes:
        faults.clear_gpu_fault(home.root / "nodes" / node)
        await maint.unreserve_node(reservation_name(node))
        with contextlib.suppress(Exception):
            await sched.resume_node(node)
