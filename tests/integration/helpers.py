"""Polling helpers for tests against the real Slurm."""

from __future__ import annotations

import asyncio
import time

from relaunch.connectors.slurm.commands import SlurmCli
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
