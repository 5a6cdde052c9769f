"""Starting, joining and steering recoveries from outside a workflow (watcher, CLI, console).

Identity: a job attempt's recovery is ``relaunch-<cluster>-<job>-<attempt>``. Slurm reuses job
ids (they wrap, and a reset cluster counts from 1 again), so the recovery already under that id
may be another job's: each recovery keeps its job's submit time in its memo, and the recovery of
a later job with the same id and attempt carries the submit time as a suffix
(``relaunch-dev-26-0-20261203T051200Z``). What a person types without the suffix is resolved
to the recovery they mean (:func:`resolve`).
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from opentelemetry import trace
from temporalio.client import (
    Client,
    WorkflowExecutionDescription,
    WorkflowExecutionStatus,
    WorkflowHandle,
    WorkflowQueryFailedError,
    WorkflowUpdateFailedError,
)
from temporalio.common import SearchAttributeKey, WorkflowIDReusePolicy
from temporalio.exceptions import ApplicationError, WorkflowAlreadyStartedError
from temporalio.service import RPCError, RPCStatusCode

from relaunch.connectors import tracing
from relaunch.connectors.temporal import STARTED_BY_MEMO, start_token, started_by
from relaunch.models import search_attributes as sa
from relaunch.models.config import ClusterConfig
from relaunch.models.errors import RelaunchError
from relaunch.models.lifecycle import (
    NodeStage,
    NoLifecycleError,
    NotAwaitingRepairError,
    RepairReturn,
    parse_lifecycle_id,
)
from relaunch.models.node_decision import parse_node_decision_id
from relaunch.models.recovery import (
    TRUSTED_DETECTION_SOURCES,
    Approval,
    Decision,
    DecisionInput,
    Detection,
    DetectionSource,
    RecoveryInput,
    RecoveryStatus,
    Stage,
    parse_recovery_id,
    recovery_workflow_id,
    same_attempt_ids,
    task_queue,
)
from relaunch.workflows.lifecycle import NodeLifecycleWorkflow
from relaunch.workflows.node_decision import NodeDecisionWorkflow
from relaunch.workflows.recovery import RecoveryWorkflow

SUBMITTED_MEMO = "submitted_at"
# A recovery from before submit times were kept has none in its memo: it belongs to an earlier
# job when it started before this job was submitted. The slack covers the Temporal server's and
# the Slurm controller's clocks disagreeing; a job id comes round again far later than this.
CLOCK_SLACK = timedelta(seconds=60)
# A closed recovery of the same attempt is started again only when its workflow failed or timed
# out (it never reached a terminal stage); one that completed, or that a person terminated or
# cancelled, is never started twice.
RESTARTABLE = frozenset({WorkflowExecutionStatus.FAILED, WorkflowExecutionStatus.TIMED_OUT})
# A recovery that ended with no action because the job still ran and its ranks advanced with no
# trusted fault does not swallow a later fault of the same attempt: a detection
# of what the job's user cannot write (or the watcher's own stall measure) opens a new recovery,
# ``<id>-r2``, ``-r3``, ... at most this many for one attempt. The job's own output, or an
# untrusted sender's event, again opens none: it would find nothing new.
MAX_RECOVERIES_PER_ATTEMPT = 8
REOPENING_SOURCES = TRUSTED_DETECTION_SOURCES | {DetectionSource.PROGRESS}
SA_STAGE = SearchAttributeKey.for_keyword(sa.STAGE.name)
_VISIBILITY_VALUE = re.compile(r"[A-Za-z0-9_.-]+")


def _epoch(when: datetime) -> int:
    return int(when.astimezone(UTC).timestamp())


async def _describe(client: Client, workflow_id: str) -> WorkflowExecutionDescription | None:
    try:
        return await client.get_workflow_handle(workflow_id).describe()
    except RPCError as exc:
        if exc.status is RPCStatusCode.NOT_FOUND:
            return None
        raise


async def _same_job(desc: WorkflowExecutionDescription, submitted_at: datetime) -> bool:
    """Whether the recovery ``desc`` describes is of the job submitted at ``submitted_at``."""
    kept = await desc.memo_value(SUBMITTED_MEMO, None, type_hint=int)
    if kept is not None:
        # A later holder of the job id was submitted after this recovery's job; a detection
        # that carries an earlier (or the same) submit time is of this recovery's job.
        return _epoch(submitted_at) <= kept
    return desc.start_time >= submitted_at - CLOCK_SLACK


async def recovery_for(
    client: Client, det: Detection
) -> tuple[str, WorkflowExecutionDescription | None]:
    """The id of the recovery of this detection's job attempt, and its latest run if there is
    one: the documented id, unless a recovery of another job (an earlier holder of the job id)
    has it; then the id with this job's submit time as a suffix."""
    documented = det.workflow_id
    desc = await _describe(client, documented)
    if desc is None or det.submitted_at is None or await _same_job(desc, det.submitted_at):
        return documented, desc
    suffixed = recovery_workflow_id(det.cluster, det.job_id, det.attempt, det.submitted_at)
    return suffixed, await _describe(client, suffixed)


def reopened_id(workflow_id: str, n: int) -> str:
    """The id of the ``n``-th recovery of one job attempt (n >= 2): see
    MAX_RECOVERIES_PER_ATTEMPT."""
    return f"{workflow_id}-r{n}"


async def _left_it_running(client: Client, desc: WorkflowExecutionDescription) -> bool:
    """Whether the recovery ``desc`` describes completed at its no_action stage because the
    job still ran and advanced (its verdict's ``still_running``): only such an end may be
    followed by another recovery of the attempt. One that ended at no_action for a cancel, a
    preemption or a time limit is the attempt's last."""
    if desc.status is not WorkflowExecutionStatus.COMPLETED:
        return False
    if desc.typed_search_attributes.get(SA_STAGE) != Stage.NO_ACTION.value:
        return False
    handle = client.get_workflow_handle(desc.id, run_id=desc.run_id, result_type=RecoveryStatus)
    status = await handle.result()
    return status.verdict is not None and status.verdict.still_running


async def current_recovery(
    client: Client, det: Detection
) -> tuple[str, WorkflowExecutionDescription | None]:
    """:func:`recovery_for`, past the recoveries of the attempt that ended with no action when
    ``det`` may open a new one (REOPENING_SOURCES): the id to signal or start, and its run."""
    workflow_id, latest = await recovery_for(client, det)
    if det.source not in REOPENING_SOURCES:
        return workflow_id, latest
    first, n = workflow_id, 1
    while (
        latest is not None
        and n < MAX_RECOVERIES_PER_ATTEMPT
        and await _left_it_running(client, latest)
    ):
        n += 1
        workflow_id = reopened_id(first, n)
        latest = await _describe(client, workflow_id)
    return workflow_id, latest


async def start_or_join(client: Client, config: ClusterConfig, det: Detection) -> bool:
    """Signal the job attempt's recovery with this detection, starting it if there is none
    (signal-with-start). Returns False when the recovery of this attempt has already ended
    (completed, or stopped by a person): it is never started again, and the late detection is
    dropped. A recovery whose workflow failed (it never reached a terminal stage) is started
    again under the same id. After a recovery that ended with no action, a detection of what
    the job's user cannot write opens the attempt's next recovery (:func:`current_recovery`)."""
    return await _signal_with_start(client, config, det, RecoveryWorkflow.detection, det, 1)


async def hand_over(client: Client, config: ClusterConfig, dets: list[Detection]) -> bool:
    """Signal the job attempt's recovery with several later detections of it at once (signal
    `detections`), as :func:`start_or_join` does with one."""
    return await _signal_with_start(
        client, config, dets[0], RecoveryWorkflow.detections, dets, len(dets)
    )


async def _signal_with_start(
    client: Client,
    config: ClusterConfig,
    det: Detection,
    signal: Callable[[RecoveryWorkflow, Any], Awaitable[None]],
    arg: object,
    count: int,
) -> bool:
    workflow_id, latest = await current_recovery(client, det)
    if (
        latest is not None
        and latest.status is not WorkflowExecutionStatus.RUNNING
        and latest.status not in RESTARTABLE
    ):
        return False
    memo: dict[str, object] = {SUBMITTED_MEMO: _epoch(det.submitted_at)} if det.submitted_at else {}
    starts = latest is None or latest.status is not WorkflowExecutionStatus.RUNNING
    token = ""
    if latest is None or starts:
        span = tracing.recovery_span(workflow_id, det)
        memo.update(tracing.trace_memo(span))
        if span.get_span_context().trace_flags.sampled:  # whether it started the run matters
            token = start_token()
            memo[STARTED_BY_MEMO] = token
    else:
        span = await tracing.follow_up_span(latest, workflow_id, det, count)
    try:
        with trace.use_span(span, end_on_exit=False):
            handle = await client.start_workflow(
                RecoveryWorkflow.run,
                RecoveryInput(
                    cluster=config.name,
                    job_id=det.job_id,
                    attempt=det.attempt,
                    policy=config.policy,
                    incident_id=workflow_id,
                ),
                id=workflow_id,
                task_queue=task_queue(config.name),
                start_signal=signal.__name__,  # the SDK's default name: the method's own
                start_signal_args=[arg],
                # The server's own guard for a run that completed between the look above and now.
                id_reuse_policy=WorkflowIDReusePolicy.ALLOW_DUPLICATE_FAILED_ONLY,
                memo=memo or None,
                static_summary=f"recovery of job {det.job_id} attempt {det.attempt}: {det.kind}",
            )
    except WorkflowAlreadyStartedError:
        return False
    finally:
        if not starts:
            span.end()  # a follow-up's span is no root: sent whatever became of the signal
    if starts and token and await started_by(client, handle, token):
        # The root is sent only when this signal started the recovery's run: a sender that
        # lost a race, or whose signal failed, leaves its root unsent (docs/tracing.md).
        span.end()
    return True


async def _handle(
    client: Client, incident: str
) -> WorkflowHandle[RecoveryWorkflow, RecoveryStatus]:
    return client.get_workflow_handle_for(RecoveryWorkflow.run, incident)


async def _later_jobs(client: Client, typed: str) -> list[str]:
    """Recoveries of later jobs that Slurm gave the job id and attempt of ``typed`` (suffixed
    ids), newest first."""
    parsed = parse_recovery_id(typed)
    if parsed is None:
        return []
    cluster, job_id, _ = parsed
    if not (_VISIBILITY_VALUE.fullmatch(cluster) and _VISIBILITY_VALUE.fullmatch(job_id)):
        return []
    found: list[tuple[datetime, str]] = []
    query = f'{sa.CLUSTER.name} = "{cluster}" AND {sa.JOB_ID.name} = "{job_id}"'
    async for wf in client.list_workflows(query):
        if wf.id != typed and same_attempt_ids(typed, [wf.id]):
            found.append((wf.start_time, wf.id))
    return [wid for _, wid in sorted(set(found), reverse=True)]


async def resolve(client: Client, incident: str, *, awaiting: bool = False) -> str:
    """The recovery a person means by ``incident``: that id when a recovery has it (and, with
    ``awaiting``, awaits approval); else the newest recovery of a later job with the same job id
    and attempt (suffixed id) that does. Returns ``incident`` itself when neither exists."""
    exact = await _describe(client, incident)
    if exact is not None and not awaiting:
        return incident
    if exact is not None and (await _query(client, incident)).awaiting_approval:
        return incident
    for later in await _later_jobs(client, incident):
        if not awaiting or (await _query(client, later)).awaiting_approval:
            return later
    return incident


async def _query(client: Client, incident: str) -> RecoveryStatus:
    handle = await _handle(client, incident)
    return await handle.query(RecoveryWorkflow.status)


async def status(client: Client, incident: str) -> RecoveryStatus:
    try:
        return await _query(client, incident)
    except RPCError as exc:
        raise RelaunchError(f"incident {incident}: {exc.message}") from exc


async def decide(
    client: Client, incident: str, decision: str, approval: Approval
) -> RecoveryStatus:
    """Put a person's approve/reject to the recovery ``incident`` means (see :func:`resolve`)
    as the workflow's `decide` update; its status with the decision taken. A recovery that
    awaits no decision (another stage, or already decided) refuses it, and nothing is sent
    in its place: the RelaunchError says why."""
    inp = DecisionInput(decision=Decision(decision), approval=approval)
    if parse_lifecycle_id(incident) is not None:  # first: a node may be named node-1
        return await _decide_lifecycle(client, incident, inp)
    if parse_node_decision_id(incident) is not None:
        return await _decide_node(client, incident, inp)
    try:
        incident = await resolve(client, incident, awaiting=True)
        handle = await _handle(client, incident)
        decided = await handle.execute_update(RecoveryWorkflow.decide, inp)
        if decided.node_decision and decided.covers is not None:
            # The decision went to the job's node decision: say how many jobs it covers now.
            with contextlib.suppress(RPCError, WorkflowQueryFailedError):
                node = await client.get_workflow_handle(decided.node_decision).query(
                    NodeDecisionWorkflow.status
                )
                decided = decided.model_copy(update={"covers": len(node.covers)})
        return decided
    except WorkflowUpdateFailedError as exc:
        cause = exc.cause
        why = cause.message if isinstance(cause, ApplicationError) else str(cause or exc)
        raise RelaunchError(f"incident {incident}: {why}") from exc
    except RPCError as exc:
        if exc.status is RPCStatusCode.NOT_FOUND:  # no such recovery, or it has ended
            why = await _ended(client, incident, exc)
            raise RelaunchError(f"incident {incident}: {why}") from exc
        raise RelaunchError(f"incident {incident}: {exc.message}") from exc


async def _decide_node(client: Client, decision_id: str, inp: DecisionInput) -> RecoveryStatus:
    """A person's decision on a node decision (it covers every job that joined it), told as
    a recovery's status: ``node_decision`` and ``covers`` say what it covers."""
    try:
        node = await client.get_workflow_handle_for(
            NodeDecisionWorkflow.run, decision_id
        ).execute_update(NodeDecisionWorkflow.decide, inp)
    except WorkflowUpdateFailedError as exc:
        cause = exc.cause
        why = cause.message if isinstance(cause, ApplicationError) else str(cause or exc)
        raise RelaunchError(f"node decision {decision_id}: {why}") from exc
    except RPCError as exc:
        raise RelaunchError(f"node decision {decision_id}: {exc.message}") from exc
    return RecoveryStatus(
        incident_id=node.decision_id,
        stage=node.stage,
        mode=node.mode,
        awaiting_approval=node.awaiting_approval,
        decided_by=node.decided_by,
        outcome=node.outcome,
        node_decisions={node.node: node.decision_id},
        node_decision=node.decision_id,
        covers=len(node.covers),
    )


async def _decide_lifecycle(client: Client, lifecycle: str, inp: DecisionInput) -> RecoveryStatus:
    """A person's decision on a node lifecycle's pending step (a rung, or the return to
    service), told as a recovery's status."""
    try:
        status = await client.get_workflow_handle_for(
            NodeLifecycleWorkflow.run, lifecycle
        ).execute_update(NodeLifecycleWorkflow.decide, inp)
    except WorkflowUpdateFailedError as exc:
        cause = exc.cause
        why = cause.message if isinstance(cause, ApplicationError) else str(cause or exc)
        raise RelaunchError(f"node lifecycle {lifecycle}: {why}") from exc
    except RPCError as exc:
        raise RelaunchError(f"node lifecycle {lifecycle}: {exc.message}") from exc
    return RecoveryStatus(
        incident_id=status.lifecycle_id,
        stage=Stage.AWAITING_APPROVAL if status.pending else Stage.ACTING,
        mode=status.mode,
        awaiting_approval=status.pending is not None,
        decided_by=inp.approval.by,
        outcome=f"{status.node} {status.stage.value}",
    )


async def signal_repaired(client: Client, cluster: str, node: str, repair: RepairReturn) -> str:
    """Tell the node's lifecycle that waits for its repair that it is repaired (signal
    `returned`); its id. RelaunchError where no lifecycle of the node waits for a repair."""
    query = (
        f'WorkflowType="NodeLifecycleWorkflow" AND ExecutionStatus="Running" AND '
        f'RelaunchCluster="{cluster}" AND RelaunchNodes="{node}"'
    )
    async for execution in client.list_workflows(query, limit=5):
        handle = client.get_workflow_handle_for(NodeLifecycleWorkflow.run, execution.id)
        status = await handle.query(NodeLifecycleWorkflow.status)
        if status.stage is not NodeStage.ESCALATED:
            raise NotAwaitingRepairError(
                f"{node}'s lifecycle {execution.id} is {status.stage.value}, not waiting for a "
                "repair"
            )
        await handle.signal(NodeLifecycleWorkflow.returned, repair)
        return execution.id
    raise NoLifecycleError(
        f"no lifecycle of {node} on {cluster} is waiting for a repair",
        hint="`relaunch nodes` shows each node's stage",
    )


async def _ended(client: Client, incident: str, exc: RPCError) -> str:
    """Why a recovery the server has no running workflow for takes no decision: its final
    stage when it ran, else the server's word."""
    try:
        final = await _query(client, incident)
    except (RPCError, WorkflowQueryFailedError):
        return exc.message
    return _refused(final)


def _refused(current: RecoveryStatus) -> str:
    """Why a recovery in this state takes no decision."""
    if current.decided_by:
        return f"already decided by {current.decided_by} (stage {current.stage.value})"
    return f"not awaiting approval (stage {current.stage.value})"
