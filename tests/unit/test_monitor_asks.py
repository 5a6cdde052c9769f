"""Monitor mode asks first for everything that changes the cluster: a node lifecycle's
reservation and checks, and its repair ticket, wait for a person unless the policy's
auto_actions names them; a recovery's hold plan waits too (the real workflows on a Temporal dev
server, fake activities under the real names). And the policy refuses an unknown auto action."""

from __future__ import annotations

import asyncio
import shutil
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest
from temporalio import activity
from temporalio.client import Client
from temporalio.common import SearchAttributeKey
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Replayer, Worker

from relaunch.models import search_attributes as sa
from relaunch.models.config import ConfigPolicy
from relaunch.models.lifecycle import NodeStage
from relaunch.models.recovery import (
    ActInput,
    Action,
    Approval,
    AutoAction,
    Decision,
    DecisionInput,
    Mode,
    Policy,
    RecoveryInput,
    Stage,
    StepOutcome,
    recovery_workflow_id,
)
from relaunch.workflows.attributes import (
    SA_AWAITING,
    SA_CATEGORY,
    SA_CLUSTER,
    SA_JOB,
    SA_MODE,
    SA_NODES,
    SA_STAGE,
)
from relaunch.workflows.lifecycle import NodeLifecycleWorkflow
from relaunch.workflows.recovery import RecoveryWorkflow
from tests.unit.test_lifecycle_workflow import Node, run, until, worker
from tests.unit.test_workflow_approval import TEMPORAL, Fakes


@pytest.fixture
async def env() -> AsyncIterator[Client]:
    """A Temporal dev server with every search attribute the recoveries and lifecycles set."""
    if not TEMPORAL.is_file() and shutil.which("temporal") is None:
        pytest.skip("no Temporal CLI (dev server) on this machine")
    keys = [SA_CLUSTER, SA_JOB, SA_CATEGORY, SA_STAGE, SA_MODE, SA_NODES, SA_AWAITING]
    environment = await WorkflowEnvironment.start_local(
        data_converter=pydantic_data_converter,
        dev_server_existing_path=str(TEMPORAL) if TEMPORAL.is_file() else shutil.which("temporal"),
        search_attributes=[*keys, SearchAttributeKey.for_keyword(sa.NODE_STAGE.name)],
    )
    try:
        yield environment.client
    finally:
        await environment.shutdown()


async def test_monitor_asks_before_the_checks_and_the_repair_ticket(env: Client) -> None:
    node = Node(answers=[False])
    handle = await run(env, Mode.MONITOR)
    async with worker(env, node):
        asked = await until(handle, lambda s: s.pending is not None)
        assert asked.pending is not None and asked.pending.step == "checks"
        await asyncio.sleep(0.5)
        assert node.runs == 0  # no reservation, no check job without an approval
        await handle.execute_update(
            NodeLifecycleWorkflow.decide,
            DecisionInput(decision=Decision.APPROVE, approval=Approval(by="ana")),
        )
        # The checks fail; the reboot waits, is rejected: the node is for repair, and the
        # ticket waits for a person too.
        await until(handle, lambda s: s.pending is not None and s.pending.step == "reboot")
        assert node.runs == 1
        await handle.execute_update(
            NodeLifecycleWorkflow.decide,
            DecisionInput(decision=Decision.REJECT, approval=Approval(by="ana")),
        )
        asked = await until(
            handle, lambda s: s.pending is not None and s.pending.step == "repair_ticket"
        )
        await asyncio.sleep(0.5)
        assert node.tickets == []
        await handle.execute_update(
            NodeLifecycleWorkflow.decide,
            DecisionInput(decision=Decision.REJECT, approval=Approval(by="ana", reason="mine")),
        )
        out = await until(handle, lambda s: s.stage is NodeStage.ESCALATED)
        assert node.tickets == [] and out.ticket == ""
        assert "no repair ticket" in " ".join(r.summary for r in node.kinds("node_stage"))
        await handle.terminate("the test is over")
    steps = [(r.data["step"], r.data["decision"]) for r in node.kinds("approval")]
    steps += [(r.data["step"], r.data["decision"]) for r in node.kinds("rejection")]
    assert sorted(steps) == [
        ("checks", "approve"), ("reboot", "reject"), ("repair_ticket", "reject"),
    ]  # fmt: skip


async def test_auto_actions_let_monitor_mode_check_and_ticket_alone(env: Client) -> None:
    node = Node(answers=[False])
    auto = [AutoAction.CHECKS, AutoAction.REPAIR_TICKET]
    handle = await run(env, Mode.MONITOR, auto_actions=auto)
    async with worker(env, node):
        asked = await until(handle, lambda s: s.pending is not None)
        assert asked.pending is not None and asked.pending.step == "reboot" and node.runs == 1
        await handle.execute_update(
            NodeLifecycleWorkflow.decide,
            DecisionInput(decision=Decision.REJECT, approval=Approval(by="ana")),
        )
        out = await until(handle, lambda s: s.stage is NodeStage.ESCALATED)
        assert out.ticket == "T-1"
        await handle.terminate("the test is over")


@dataclass
class Counting(Fakes):
    """The recovery's fakes, counting the holds."""

    holds: int = 0

    @activity.defn(name="hold")
    async def hold(self, inp: ActInput) -> StepOutcome:
        self.holds += 1
        return StepOutcome(ok=True, changed=True, detail="held")


@pytest.mark.parametrize("auto", [False, True], ids=["asks", "auto_actions-hold"])
async def test_monitor_mode_holds_nothing_without_an_approval(env: Client, auto: bool) -> None:
    fakes = Counting()
    job_id = str(uuid.uuid4().int % 10**9)
    fakes.actions[job_id] = Action.HOLD  # the plan: hold the job (an application error)
    steps = [
        fakes.record_detection, fakes.record_event, fakes.plan, fakes.isolate, fakes.restart,
        fakes.hold, fakes.verify_check, fakes.investigate,
    ]  # fmt: skip
    policy = Policy(approval_timeout_s=60, auto_actions=[AutoAction.HOLD] if auto else [])
    queue = f"monitor-asks-{uuid.uuid4().hex[:6]}"
    async with Worker(env, task_queue=queue, workflows=[RecoveryWorkflow], activities=steps):
        handle = await env.start_workflow(
            RecoveryWorkflow.run,
            RecoveryInput(cluster="wftest", job_id=job_id, attempt=0, policy=policy),
            id=recovery_workflow_id("wftest", job_id, 0),
            task_queue=queue,
        )
        if auto:  # the policy lets monitor mode hold alone
            assert (await handle.result()).stage is Stage.HELD and fakes.holds == 1
            return
        for _ in range(200):
            status = await handle.query(RecoveryWorkflow.status)
            if status.stage is Stage.AWAITING_APPROVAL:
                break
            await asyncio.sleep(0.05)
        assert status.plan is not None and status.plan.action is Action.HOLD
        await asyncio.sleep(0.5)
        assert (await handle.query(RecoveryWorkflow.status)).stage is Stage.AWAITING_APPROVAL
        assert fakes.holds == 0
        await handle.signal(RecoveryWorkflow.approve, Approval(by="ana"))
        done = await handle.result()
    assert done.stage is Stage.HELD and fakes.holds == 1
    assert [r.actor for r in fakes.rows(done.incident_id, "approval")] == ["ana"]
    replayer = Replayer(workflows=[RecoveryWorkflow], data_converter=pydantic_data_converter)
    await replayer.replay_workflow(await handle.fetch_history())


def test_the_policy_refuses_an_unknown_auto_action() -> None:
    with pytest.raises(ValueError, match="auto_actions.0"):
        ConfigPolicy.model_validate({"auto_actions": ["drain"]})
    assert ConfigPolicy.model_validate({"auto_actions": ["hold"]}).auto_actions == [AutoAction.HOLD]
