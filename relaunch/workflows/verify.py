"""How a recovery verifies the job it restarted (relaunch/workflows/recovery.py)."""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow
from temporalio.exceptions import ActivityError, ApplicationError

with workflow.unsafe.imports_passed_through():
    from relaunch.activities.actions import ActionActivities
    from relaunch.models.recovery import RecoveryInput, Stage, VerifyCheck, VerifyInput
    from relaunch.workflows.calls import OBSERVE, call

# Before each look at a restarted job: 5 s, growing by half each time, to 10 s. A requeued job
# waits out Slurm's cred_expire (10 s at the least that is sane) before it runs again, so an
# earlier look finds nothing; each look is a workflow task, and hundreds of recoveries look at
# once after a rack failure.
VERIFY_FIRST_PAUSE = timedelta(seconds=5)
VERIFY_MAX_PAUSE = timedelta(seconds=10)


async def verify_restart(
    incident: str, inp: RecoveryInput, job_id: str, avoid: list[str], checkpoint: int | None
) -> tuple[Stage, str]:
    """Look at the restarted job until it runs on healthy nodes (and past its checkpoint),
    with a durable timer between looks; no activity slot is held while it comes back. The
    recovery's last stage and its outcome."""
    timeout = timedelta(seconds=inp.policy.verify_timeout_s)
    deadline = workflow.now() + timeout
    pause = VERIFY_FIRST_PAUSE
    check = VerifyCheck()
    while True:
        await workflow.sleep(pause, summary="until the next look at the job")
        pause = min(pause * 1.5, VERIFY_MAX_PAUSE)
        try:
            check = await call(
                ActionActivities.verify_check,
                VerifyInput(
                    incident_id=incident,
                    cluster=inp.cluster,
                    job_id=job_id,
                    avoid_nodes=avoid,
                    checkpoint_step=checkpoint,
                    timeout_s=inp.policy.verify_timeout_s,
                ),
                OBSERVE,
                "verify: look at the job",
                local=True,
            )
        except (ActivityError, ApplicationError) as err:
            cause = err.cause if isinstance(err, ActivityError) else err
            return (Stage.FAILED, f"failed in verifying: {getattr(cause, 'message', cause)}")
        if check.done:
            return (Stage.DONE, check.detail)
        if check.failed:
            return (Stage.FAILED, f"failed in verifying: {check.detail}")
        if workflow.now() >= deadline:
            return (
                Stage.FAILED,
                f"failed in verifying: job {job_id} not running on healthy nodes after "
                f"{timeout.total_seconds():.0f}s ({check.detail})",
            )
