"""Starting, joining and steering recoveries from outside a workflow (watcher, CLI, console)."""

from __future__ import annotations

from temporalio.client import Client, WorkflowHandle
from temporalio.common import WorkflowIDReusePolicy
from temporalio.exceptions import WorkflowAlreadyStartedError
from temporalio.service import RPCError

from relaunch.models.config import ClusterConfig
from relaunch.models.errors import RelaunchError
from relaunch.models.recovery import (
    Approval,
    Detection,
    RecoveryInput,
    RecoveryStatus,
    task_queue,
)
from relaunch.workflows.recovery import RecoveryWorkflow


async def start_or_join(client: Client, config: ClusterConfig, det: Detection) -> bool:
    """Signal the job attempt's recovery with this detection, starting it if there is none
    (signal-with-start). Returns False when the recovery of this attempt has already closed:
    it is never started again, and the late detection is dropped."""
    try:
        await client.start_workflow(
            RecoveryWorkflow.run,
            RecoveryInput(
                cluster=config.name, job_id=det.job_id, attempt=det.attempt, policy=config.policy
            ),
            id=det.workflow_id,
            task_queue=task_queue(config.name),
            start_signal="detection",
            start_signal_args=[det],
            id_reuse_policy=WorkflowIDReusePolicy.REJECT_DUPLICATE,
            static_summary=f"recovery of job {det.job_id} attempt {det.attempt}: {det.kind}",
        )
    except WorkflowAlreadyStartedError:
        return False
    return True


async def _handle(
    client: Client, incident: str
) -> WorkflowHandle[RecoveryWorkflow, RecoveryStatus]:
    return client.get_workflow_handle_for(RecoveryWorkflow.run, incident)


async def status(client: Client, incident: str) -> RecoveryStatus:
    try:
        handle = await _handle(client, incident)
        return await handle.query(RecoveryWorkflow.status)
    except RPCError as exc:
        raise RelaunchError(f"incident {incident}: {exc.message}") from exc


async def decide(
    client: Client, incident: str, decision: str, approval: Approval
) -> RecoveryStatus:
    """Send approve/reject — the same signal the UI and `temporal workflow signal` send."""
    current = await status(client, incident)
    if not current.awaiting_approval:
        raise RelaunchError(
            f"incident {incident} is not awaiting approval (stage {current.stage.value})"
        )
    handle = await _handle(client, incident)
    signal = RecoveryWorkflow.approve if decision == "approve" else RecoveryWorkflow.reject
    await handle.signal(signal, approval)
    return current
