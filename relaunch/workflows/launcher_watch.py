"""How a recovery lets a job's own launcher restart it in the job (relaunch/workflows/recovery.py,
docs/spares.md): an application error in a job that Slurm still lists RUNNING, under torchrun's
elastic agent or NVRx's ft_launcher, is the launcher's to restart first. The recovery looks at
the job on a durable timer until it trains again in the same attempt (an in-job restart: recorded,
nothing done), it ends or is requeued, or the policy's grace runs out; then it plans as always."""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow
from temporalio.exceptions import ActivityError, ApplicationError

with workflow.unsafe.imports_passed_through():
    from relaunch.activities.actions import ActionActivities
    from relaunch.models.recovery import (
        Category,
        EvidenceSummary,
        LauncherLook,
        LauncherLookInput,
        RecoveryInput,
        Verdict,
    )
    from relaunch.workflows.calls import OBSERVE, call

LOOK_PAUSE = timedelta(seconds=1)
# Without a launcher's line in the job's output by then, the job has none that restarts it.
NO_LAUNCHER_AFTER = timedelta(seconds=5)


def launcher_may_restart(inp: RecoveryInput, verdict: Verdict, evidence: EvidenceSummary) -> bool:
    """Whether this recovery first gives the job's launcher its chance: an application error
    (which blames no node) in a job still running, under a policy that allows the wait, whose
    output file the evidence read (so that only what the job printed since counts: a job read
    from a log store has no such mark)."""
    return (
        verdict.category is Category.APPLICATION
        and evidence.job.state.upper().startswith("RUNNING")
        and evidence.job.log_size > 0
        and inp.policy.launcher_grace_s > 0
    )


async def watch_launcher(
    incident: str, inp: RecoveryInput, evidence: EvidenceSummary
) -> tuple[LauncherLook, timedelta]:
    """Look at the job until its launcher has it training again, it ends, or the wait is over.
    The last look, and how long after the recovery's start it was taken."""
    began = workflow.now()
    deadline = began + timedelta(seconds=inp.policy.launcher_grace_s)
    job = evidence.job
    look = LauncherLook(launcher=job.launcher)
    while workflow.now() < deadline:
        await workflow.sleep(LOOK_PAUSE, summary="until the next look at the job's launcher")
        try:
            look = await call(
                ActionActivities.launcher_look,
                LauncherLookInput(
                    incident_id=incident,
                    cluster=inp.cluster,
                    job_id=job.job_id,
                    restart_count=job.restart_count,
                    since_offset=job.log_size,
                    launcher=look.launcher,
                ),
                OBSERVE,
                "look at the job's launcher",
                local=True,
            )
        except (ActivityError, ApplicationError) as err:
            cause = err.cause if isinstance(err, ActivityError) else err
            look = look.model_copy(
                update={"detail": f"no look: {getattr(cause, 'message', cause)}"}
            )
            break
        if look.trained_again or look.ended:
            break
        if not look.launcher and workflow.now() - began >= NO_LAUNCHER_AFTER:
            break
    return look, workflow.now() - began
