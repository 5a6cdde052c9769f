"""The real NodeLifecycleWorkflow on a Temporal dev server, with fake activities under the real
activity names (no Slurm, no PostgreSQL): the ladder climbed once per rung, approvals in monitor
mode, a rejection sending the node to repair, a repair validated, a lifecycle continued as new
while it waits for its repair."""

from __future__ import annotations

import asyncio
import os
import shutil
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from temporalio import activity
from temporalio.client import Client, WorkflowHandle, WorkflowUpdateFailedError
from temporalio.common import SearchAttributeKey
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Replayer, Worker

from relaunch.models import search_attributes as sa
from relaunch.models.lifecycle import (
    CheckResult,
    CheckRun,
    ChecksInput,
    EscalateInput,
    EscalateResult,
    HoldInput,
    LifecycleCarry,
    LifecycleFault,
    LifecycleInput,
    LifecycleSettings,
    LifecycleStatus,
    NodeStage,
    NodeStepInput,
    RepairReturn,
    ReturnResult,
    Rung,
    RungInput,
    RungResult,
    StartInput,
    StartResult,
)
from relaunch.models.recovery import (
    Approval,
    AutoAction,
    Category,
    Decision,
    DecisionInput,
    Mode,
    RecordEventInput,
)
from relaunch.workers.worker import WORKFLOW_RUNNER
from relaunch.workflows import lifecycle as lifecycle_module
from relaunch.workflows.attributes import SA_AWAITING, SA_CLUSTER, SA_MODE, SA_NODES
from relaunch.workflows.lifecycle import NodeLifecycleWorkflow
from tests.unit.test_workflow_approval import TEMPORAL

QUEUE = "relaunch-lifecycle-tests"
NOW = datetime(2026, 12, 4, 12, 0, tzinfo=UTC)
pytestmark = pytest.mark.skipif(
    not TEMPORAL.is_file() and shutil.which("temporal") is None,
    reason="no Temporal CLI (dev server) on this machine",
)


@dataclass
class Node:
    """What the fake activities do to the node, and what its checks find (one answer per run,
    the last repeated)."""

    answers: list[bool] = field(default_factory=lambda: [False, True])
    escalate: str = ""
    drained: bool = True  # out of service when the lifecycle starts
    inconclusive: str = ""  # what the checks say when a job never left the node
    runs: int = 0
    rungs: list[Rung] = field(default_factory=list)
    holds: list[str] = field(default_factory=list)
    tickets: list[EscalateInput] = field(default_factory=list)
    returned: int = 0
    released: int = 0  # a suspect's reservation ended (no drain cleared)
    records: list[RecordEventInput] = field(default_factory=list)
    gate: asyncio.Event | None = None  # set: the return waits for it
    checks_gate: asyncio.Event | None = None  # set: the checks wait for it
    undrained: bool = False  # a drain's fault finds the node back in service

    @activity.defn(name="record_event")
    async def record_event(self, inp: RecordEventInput) -> bool:
        self.records.append(inp)
        return True

    @activity.defn(name="lifecycle_start")
    async def start(self, inp: StartInput) -> StartResult:
        return StartResult(
            drained=self.out(inp.fault),
            state="DOWN+DRAIN" if self.out(inp.fault) else "MIXED",
            ladder=[Rung.REBOOT, Rung.ESCALATE],
            escalate=self.escalate,
        )  # fmt: skip

    def out(self, fault: LifecycleFault) -> bool:
        """Out of service when the lifecycle looks for ``fault``: a drain's fault finds the
        node drained unless the test cleared it; a suspicion, as the test sets it."""
        return self.drained or (not fault.suspect and not self.undrained)

    @activity.defn(name="lifecycle_reserve")
    async def reserve(self, inp: NodeStepInput) -> str:
        return "IDLE+MAINTENANCE+RESERVED"

    @activity.defn(name="lifecycle_hold")
    async def hold(self, inp: HoldInput) -> str:
        self.holds.append(inp.why)
        return "drained"

    @activity.defn(name="lifecycle_checks")
    async def checks(self, inp: ChecksInput) -> CheckRun:
        if self.checks_gate is not None:
            await self.checks_gate.wait()
        ok = self.answers[min(self.runs, len(self.answers) - 1)]
        self.runs += 1
        result = CheckResult(id="dev-gpu", passed=ok, detail="exit 0" if ok else "exit 1")
        if self.inconclusive:
            return CheckRun(
                purpose=inp.purpose, started_at=NOW, finished_at=NOW,
                inconclusive=self.inconclusive,
            )  # fmt: skip
        return CheckRun(purpose=inp.purpose, results=[result], started_at=NOW, finished_at=NOW)

    @activity.defn(name="lifecycle_rung")
    async def rung(self, inp: RungInput) -> RungResult:
        self.rungs.append(inp.rung)
        return RungResult(rung=inp.rung, done=True, detail="slurmd restarted")

    @activity.defn(name="lifecycle_escalate")
    async def escalate_(self, inp: EscalateInput) -> EscalateResult:
        self.tickets.append(inp)
        return EscalateResult(ticket=f"T-{len(self.tickets)}", posted=True, detail="posted")

    @activity.defn(name="lifecycle_return")
    async def return_node(self, inp: NodeStepInput) -> ReturnResult:
        if self.gate is not None:
            await self.gate.wait()
        self.returned += 1
        return ReturnResult(returned=True, detail=f"{inp.node} back in service (IDLE)")

    @activity.defn(name="lifecycle_release")
    async def release(self, inp: NodeStepInput) -> ReturnResult:
        if self.gate is not None:
            await self.gate.wait()
        self.released += 1
        return ReturnResult(returned=True, detail=f"its reservation ended; {inp.node} in service")

    def kinds(self, kind: str) -> list[RecordEventInput]:
        return [r for r in self.records if r.kind == kind]


@pytest.fixture
async def env() -> AsyncIterator[Client]:
    environment = await WorkflowEnvironment.start_local(
        data_converter=pydantic_data_converter,
        dev_server_existing_path=str(TEMPORAL) if TEMPORAL.is_file() else shutil.which("temporal"),
        search_attributes=[
            SA_CLUSTER,
            SA_MODE,
            SA_NODES,
            SA_AWAITING,
            SearchAttributeKey.for_keyword(sa.NODE_STAGE.name),
        ],
    )
    try:
        yield environment.client
    finally:
        await environment.shutdown()


def worker(client: Client, node: Node) -> Worker:
    return Worker(
        client,
        task_queue=QUEUE,
        workflows=[NodeLifecycleWorkflow],
        workflow_runner=WORKFLOW_RUNNER,
        activities=[
            node.record_event, node.start, node.reserve, node.hold, node.checks, node.rung,
            node.escalate_, node.return_node, node.release,
        ],
    )  # fmt: skip


async def run(
    client: Client,
    mode: Mode,
    carry: LifecycleCarry | None = None,
    auto_actions: list[AutoAction] | None = None,
    fault: LifecycleFault | None = None,
) -> WorkflowHandle[NodeLifecycleWorkflow, LifecycleStatus]:
    inp = LifecycleInput(
        cluster="c",
        node="n1",
        n=1,
        mode=mode,
        approval_timeout_s=60,
        settings=LifecycleSettings(settle_s=0),
        carry=carry,
        auto_actions=auto_actions or [],
    )
    return await client.start_workflow(
        NodeLifecycleWorkflow.run,
        inp,
        id=f"relaunch-c-lifecycle-n1-{uuid.uuid4().hex[:6]}",
        task_queue=QUEUE,
        start_signal=NodeLifecycleWorkflow.fault.__name__,
        start_signal_args=[fault or FAULT],
    )


FAULT = LifecycleFault(
    incident_id="relaunch-c-node-n1-1", category=Category.GPU_HARDWARE, remedy="reboot",
    kind="gpu_hardware/reboot", at=NOW,
)  # fmt: skip
# The jobs of two users printed a GPU error naming n1: job output alone, never a drain.
SUSPECT = LifecycleFault(
    incident_id="relaunch-c-7-0", category=Category.GPU_HARDWARE, kind="suspect/gpu_hardware",
    at=NOW, suspect=True,
)  # fmt: skip


HISTORIES = Path(__file__).resolve().parents[1] / "histories"
# The steps the monitor-mode tests here let the lifecycle take without asking (the policy's
# auto_actions): they are about the rungs and the return (tests/unit/test_monitor_asks.py asks).
UNASKED = [AutoAction.CHECKS, AutoAction.REPAIR_TICKET]


async def replays(client: Client, workflow_id: str, keep_as: str) -> None:
    """The history replays against today's workflow; kept for tests/unit/test_replay.py with
    RELAUNCH_RECORD_HISTORIES=1."""
    history = await client.get_workflow_handle(workflow_id).fetch_history()
    replayer = Replayer(
        workflows=[NodeLifecycleWorkflow],
        workflow_runner=WORKFLOW_RUNNER,
        data_converter=pydantic_data_converter,
    )
    await replayer.replay_workflow(history)
    if os.environ.get("RELAUNCH_RECORD_HISTORIES") == "1":
        (HISTORIES / f"{keep_as}.json").write_text(history.to_json())


async def until(
    handle: WorkflowHandle[NodeLifecycleWorkflow, LifecycleStatus], check
) -> LifecycleStatus:  # type: ignore[no-untyped-def]

    for _ in range(200):
        status = await handle.query(NodeLifecycleWorkflow.status)
        if check(status):
            return status
        await asyncio.sleep(0.05)
    raise AssertionError(f"never: {status}")


async def test_autonomous_reboots_once_then_returns_on_passing_checks(env: Client) -> None:
    node = Node(answers=[False, True])
    handle = await run(env, Mode.AUTONOMOUS)
    async with worker(env, node):
        done = await handle.result()
    await replays(env, handle.id, "lifecycle_returned_autonomous")
    assert done.stage is NodeStage.RETURNED and done.tried == [Rung.REBOOT]
    assert node.rungs == [Rung.REBOOT] and node.returned == 1 and node.holds == ["checks failed"]
    stages = [r.stage for r in node.kinds("node_stage")]
    assert stages == [
        "suspect", "drained", "diagnosing", "remediating", "validating", "returned"
    ]  # fmt: skip
    assert [r.stage for r in node.kinds("stage")] == ["done"]


async def test_monitor_asks_before_the_reboot_and_the_return(env: Client) -> None:
    node = Node(answers=[False, True], gate=asyncio.Event())
    handle = await run(env, Mode.MONITOR, auto_actions=UNASKED)
    async with worker(env, node):
        asked = await until(handle, lambda s: s.pending is not None)
        assert asked.pending is not None and asked.pending.step == "reboot" and node.rungs == []
        by = Approval(by="ana")
        await handle.execute_update(
            NodeLifecycleWorkflow.decide, DecisionInput(decision=Decision.APPROVE, approval=by)
        )
        asked = await until(handle, lambda s: s.pending is not None and s.pending.step == "return")
        assert node.returned == 0 and node.holds[-1] == "checks passed, return awaits approval"
        # Only the step pending is decided: a second decision on it is refused.
        await handle.execute_update(
            NodeLifecycleWorkflow.decide, DecisionInput(decision=Decision.APPROVE, approval=by)
        )
        with pytest.raises(WorkflowUpdateFailedError):
            await handle.execute_update(
                NodeLifecycleWorkflow.decide, DecisionInput(decision=Decision.REJECT, approval=by)
            )
        assert node.gate is not None
        node.gate.set()
        done = await handle.result()
    await replays(env, handle.id, "lifecycle_monitor_approved")
    assert done.stage is NodeStage.RETURNED and node.returned == 1
    assert [r.data["step"] for r in node.kinds("approval")] == ["reboot", "return"]


async def test_a_rejected_reboot_sends_the_node_to_repair_and_a_repair_is_validated(
    env: Client,
) -> None:
    node = Node(answers=[False, False, True])
    handle = await run(env, Mode.MONITOR, auto_actions=UNASKED)
    async with worker(env, node):
        await until(handle, lambda s: s.pending is not None)
        await handle.execute_update(
            NodeLifecycleWorkflow.decide,
            DecisionInput(decision=Decision.REJECT, approval=Approval(by="ana", reason="no")),
        )
        sent = await until(handle, lambda s: s.stage is NodeStage.ESCALATED)
        assert sent.ticket == "T-1" and node.rungs == [] and "rejected by ana" in sent.outcome
        # Repaired, but the checks still fail: back to repair, a second ticket.
        await handle.signal(NodeLifecycleWorkflow.returned, RepairReturn(by="tech"))
        await until(handle, lambda s: s.ticket == "T-2")
        await handle.signal(NodeLifecycleWorkflow.returned, RepairReturn(by="tech", ticket="T-2"))
        await until(handle, lambda s: s.pending is not None and s.pending.step == "return")
        await handle.execute_update(
            NodeLifecycleWorkflow.decide,
            DecisionInput(decision=Decision.APPROVE, approval=Approval(by="ana")),
        )
        done = await handle.result()
    await replays(env, handle.id, "lifecycle_rejected_repaired")
    assert done.stage is NodeStage.RETURNED and node.runs == 3
    assert [r.data["by"] for r in node.kinds("repaired")] == ["tech", "tech"]


async def test_straight_to_repair_and_continued_as_new_while_waiting(env: Client) -> None:
    node = Node(answers=[True], escalate="returned to service by relaunch-c-lifecycle-n1-0")
    handle = await run(env, Mode.AUTONOMOUS)
    async with worker(env, node):
        sent = await until(handle, lambda s: s.stage is NodeStage.ESCALATED)
        assert sent.outcome.endswith("returned to service by relaunch-c-lifecycle-n1-0")
        assert node.rungs == [] and node.returned == 0  # passing checks do not return a lemon
        status = await handle.query(NodeLifecycleWorkflow.status)
        carry = LifecycleCarry(
            faults=status.faults, ladder=status.ladder, tried=status.tried, runs=status.runs,
            ticket=status.ticket, visits=20, decisions=0, why="lemon",
        )  # fmt: skip
        await handle.terminate("replaced by its continued run below")
        again = await run(env, Mode.AUTONOMOUS, carry=carry)
        waiting = await until(again, lambda s: s.stage is NodeStage.ESCALATED)
        assert waiting.ticket == "T-1" and len(node.tickets) == 1  # not posted again
        await again.signal(NodeLifecycleWorkflow.returned, RepairReturn(by="tech"))
        done = await again.result()
    assert done.stage is NodeStage.RETURNED and node.returned == 1


async def test_a_suspect_whose_checks_pass_is_never_drained_and_stays_in_service(
    env: Client,
) -> None:
    node = Node(drained=False, answers=[True])
    handle = await run(env, Mode.AUTONOMOUS, fault=SUSPECT)
    async with worker(env, node):
        done = await handle.result()
    await replays(env, handle.id, "lifecycle_suspect_cleared")
    assert done.stage is NodeStage.CLOSED and "suspect cleared: the checks passed" in done.outcome
    # Fenced for its checks, then released: never drained (nor undrained), no rung, no ticket.
    assert node.runs == 1 and node.released == 1 and node.returned == 0
    assert node.holds == [] and node.rungs == [] and node.tickets == []
    stages = [r.stage for r in node.kinds("node_stage")]
    assert stages == ["suspect", "diagnosing", "closed"]


async def test_a_suspect_whose_own_checks_fail_is_held_and_climbs_the_ladder(
    env: Client,
) -> None:
    """Failing checks are Relaunch's own evidence: only they take a suspect out of service."""
    node = Node(drained=False, answers=[False, True])
    handle = await run(env, Mode.AUTONOMOUS, fault=SUSPECT)
    async with worker(env, node):
        done = await handle.result()
    assert done.stage is NodeStage.RETURNED and done.tried == [Rung.REBOOT]
    assert node.holds == ["checks failed"] and node.rungs == [Rung.REBOOT]


async def test_a_suspect_whose_checks_say_nothing_is_left_in_service(env: Client) -> None:
    node = Node(drained=False, inconclusive="job 12 still on n1 after 600s")
    handle = await run(env, Mode.AUTONOMOUS, fault=SUSPECT)
    async with worker(env, node):
        done = await handle.result()
    assert done.stage is NodeStage.CLOSED and "inconclusive" in done.outcome
    assert node.holds == [] and node.rungs == [] and node.tickets == [] and node.released == 1


async def test_a_suspect_drained_by_someone_else_is_left_to_them(
    env: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No drain's fault comes (DRAIN_FAULT_WAIT, 60 s in service): someone else's drain."""
    monkeypatch.setattr(lifecycle_module, "DRAIN_FAULT_WAIT", timedelta(seconds=0.5))
    node = Node(drained=True)
    handle = await run(env, Mode.AUTONOMOUS, fault=SUSPECT)
    async with worker(env, node):
        done = await handle.result()
    assert done.stage is NodeStage.CLOSED and "left as it is" in done.outcome
    assert node.runs == 0 and node.returned == 0 and node.released == 0 and node.holds == []


async def test_a_suspects_checks_rejected_in_monitor_mode_release_it_untouched(
    env: Client,
) -> None:
    node = Node(drained=False, answers=[False])
    handle = await run(env, Mode.MONITOR, fault=SUSPECT)
    async with worker(env, node):
        asked = await until(handle, lambda s: s.pending is not None)
        assert asked.pending is not None and asked.pending.step == "checks"
        await handle.execute_update(
            NodeLifecycleWorkflow.decide,
            DecisionInput(decision=Decision.REJECT, approval=Approval(by="ana")),
        )
        done = await handle.result()
    assert done.stage is NodeStage.CLOSED and "no checks" in done.outcome
    assert node.runs == 0 and node.holds == [] and node.rungs == [] and node.released == 1


async def test_a_drain_during_a_suspects_checks_makes_it_the_drains_lifecycle(
    env: Client,
) -> None:
    """A real fault drains the node while its suspicion's checks wait: nothing is released
    (the drain stands); the lifecycle goes on as the drain's, to its return."""
    node = Node(drained=False, answers=[True, True], checks_gate=asyncio.Event())
    handle = await run(env, Mode.AUTONOMOUS, fault=SUSPECT)
    async with worker(env, node):
        await until(handle, lambda s: s.stage is NodeStage.DIAGNOSING)
        await handle.signal(NodeLifecycleWorkflow.fault, FAULT)  # the node decision's drain
        await until(handle, lambda s: len(s.faults) == 2)
        assert node.checks_gate is not None
        node.checks_gate.set()
        done = await handle.result()
    assert done.stage is NodeStage.RETURNED and node.released == 0 and node.returned == 1
    stages = [r.stage for r in node.kinds("node_stage")]
    assert stages == ["suspect", "diagnosing", "drained", "diagnosing", "returned"], stages


async def test_a_drain_its_checks_cleared_leaves_no_fence_behind(env: Client) -> None:
    """The drain came during the suspect's checks, and the checks (inside the reservation)
    cleared it and passed: the node is in service, so the lifecycle ends as the suspect's does,
    its reservation ended."""
    node = Node(drained=False, answers=[True], undrained=True, checks_gate=asyncio.Event())
    handle = await run(env, Mode.AUTONOMOUS, fault=SUSPECT)
    async with worker(env, node):
        await until(handle, lambda s: s.stage is NodeStage.DIAGNOSING)
        await handle.signal(NodeLifecycleWorkflow.fault, FAULT)
        await until(handle, lambda s: len(s.faults) == 2)
        assert node.checks_gate is not None
        node.checks_gate.set()
        done = await handle.result()
    assert done.stage is NodeStage.CLOSED and "suspect cleared" in done.outcome
    assert node.released == 1 and node.returned == 0 and node.runs == 1
