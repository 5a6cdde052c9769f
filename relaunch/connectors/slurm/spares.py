"""A job that trains again on a spare node of its own allocation, through the Slurm CLI (local or
over SSH): the convicted node leaves the running job (``scontrol update JobId= NodeList=``, the
job shrunk), and the job's running steps end, so that its script starts them again on what is
left (docs/spares.md).

Each action reads fresh state first (a retried call changes nothing it already did) and
verifies after. Names that reach a command line are validated; every command has a timeout.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TYPE_CHECKING

from relaunch.models import names
from relaunch.models.errors import InvalidStateError, SchedulerError
from relaunch.models.scheduler import ActionResult, JobState

if TYPE_CHECKING:
    from relaunch.connectors.slurm.commands import SlurmCli

# A job step's id in `squeue --steps` (`1234.0`, `1234.5`); the batch and extern steps
# (`1234.batch`, `1234.extern`) are the job's script and Slurm's own: never ended here.
_STEP = re.compile(r"(\d{1,12})\.(\d{1,9})")
# At most this many steps of one job are ended in one call (a job may start steps in a loop).
MAX_STEPS = 64


class ShrinkRefusedError(SchedulerError):
    """Slurm would not take the node out of the job (its batch script runs there, the job is
    not running, its Slurm refuses to resize): the job restarts whole instead."""


class SpareActions:
    """What a spare-node restart does to a running job through the Slurm CLI of ``cli``: see
    the module's docstring. ``SlurmCli.spares()`` makes one."""

    def __init__(self, cli: SlurmCli) -> None:
        self._cli = cli

    async def leave(self, job_id: str, nodes: Sequence[str]) -> ActionResult:
        """Take ``nodes`` out of the running job ``job_id``: Slurm ends the job's processes
        there and the job goes on RUNNING on the rest of its allocation. Verified by a fresh
        read; a node already gone from the job is not asked for again."""
        cli = self._cli
        job_id = names.job_id(job_id)
        gone = {names.node_name(n) for n in nodes}
        before = await cli.get_job(job_id)
        leaving = gone & set(before.nodes)
        if not leaving:
            return cli._job_result(
                "shrink", before, before, changed=False, note="already out of the job"
            )
        if before.state is not JobState.RUNNING:
            raise InvalidStateError(
                f"job {job_id} is {before.state.value}: only a running job gives a node up"
            )
        keep = [n for n in before.nodes if n not in gone]
        if not keep:
            raise ShrinkRefusedError(f"job {job_id} would keep no node")
        result = await cli._run(
            ["scontrol", "update", f"JobId={job_id}", f"NodeList={','.join(keep)}"]
        )
        if result.returncode != 0:
            text = (result.stderr or result.stdout).strip()
            # "Invalid node name specified": the batch host cannot leave its own job.
            raise ShrinkRefusedError(
                f"Slurm kept {','.join(sorted(leaving))} in job {job_id}: {text[:200]}"
            )
        after = await cli._until(
            lambda: cli.get_job(job_id),
            lambda j: not gone & set(j.nodes),
            f"shrink {job_id}",
        )
        return cli._job_result("shrink", before, after, changed=True)

    async def steps(self, job_id: str) -> list[str]:
        """The ids of the job's running steps (not its batch or extern step), from a fresh
        ``squeue --steps`` read of Slurm's own fields."""
        job_id = names.job_id(job_id)
        result = await self._cli._checked(["squeue", "-h", "--steps", "-j", job_id, "-o", "%i"])
        found = []
        for line in result.stdout.splitlines()[: MAX_STEPS * 4]:
            m = _STEP.fullmatch(line.strip())
            if m and m.group(1) == job_id:
                found.append(m.group(0))
        return found[:MAX_STEPS]

    async def end_steps(self, job_id: str, step_ids: Sequence[str]) -> ActionResult:
        """End the job's steps ``step_ids`` (``scancel JOB.STEP``), those a caller read with
        :meth:`steps`: never a step the job's script started since. Verified by a fresh read."""
        cli = self._cli
        job_id = names.job_id(job_id)
        wanted = [s for s in step_ids if (m := _STEP.fullmatch(s)) and m.group(1) == job_id]
        running = set(await self.steps(job_id))
        ending = [s for s in wanted if s in running]
        if not ending:
            return ActionResult(
                action="end_steps",
                target=job_id,
                changed=False,
                before="steps " + (",".join(wanted) or "-"),
                after="already ended",
                note="already ended",
            )
        await cli._checked(["scancel", *ending])
        await cli._until(
            lambda: self.steps(job_id),
            lambda now: not set(ending) & set(now),
            f"end the steps of {job_id}",
        )
        return ActionResult(
            action="end_steps",
            target=job_id,
            changed=True,
            before="steps " + ",".join(ending),
            after="ended",
        )
