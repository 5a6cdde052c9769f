"""RecoveryWorkflow's orchestration on the real Temporal dev server, with activities replaced by
recording fakes (a unique task queue per test): stages, approval, rejection, expiry, the
decision being recorded, holds, and that nothing acts before approval."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import UTC, datetime

import pytest
from temporalio import activity
from temporalio.client import Client, WorkflowHandle
from temporalio.worker import Worker

from relaunch.models.node_decision import Investigation, Joined
from relaunch.models.recovery import (
    ActInput,
    Action,
    ActionPlan,
    Approval,
    AttributeInput,
    AutoAction,
    Category,
    Detection,
    DetectionSource,
    EvidenceSummary,
    GatherInput,
    GuardDecision,
    JobSnapshot,
    Mode,
    Policy,
    RecoveryInput,
    RecoveryStatus,
    Stage,
    StepOutcome,
    Verdict,
    VerifyCheck,
    VerifyInput,
)
from relaunch.workflows.recovery import RecoveryWorkflow


@dataclass
class Fakes:
    """Activities that record their calls and return canned results."""

    action: Action = Action.ISOLATE_AND_RESTART
    mode: Mode = Mode.MONITOR
    needs_override: bool = False  # the blast-radius guard refused the plan
    isolate_ok: bool = True  # False: isolate's re-check refuses the drain
    calls: list[str] = field(default_factory=list)
    events: list[dict[str, object]] = field(default_factory=list)

    def activities(self) -> list[object]:
        @activity.defn(name="record_detection")
        async def record_detection(inp: dict[str, object]) -> bool:
            self.calls.append("record_detection")
            return True

        @activity.defn(name="record_event")
        async def record_event(inp: dict[str, object]) -> bool:
            self.events.append(inp)
            return True

        async def gather_evidence(inp: GatherInput) -> EvidenceSummary:
            self.calls.append("gather_evidence")
            return EvidenceSummary(
                incident_id=inp.incident_id,
                bundle_path="/nonexistent",
                job=JobSnapshot(job_id=inp.job_id, nodes=["n1", "n2"], last_checkpoint_step=10),
            )

        async def attribute(inp: AttributeInput) -> Verdict:
            self.calls.append("attribute")
            return Verdict(
                category=Category.GPU_HARDWARE,
                culprit_nodes=["n2"],
                confidence=0.9,
                action=self.action,
            )

        @activity.defn(name="plan")
        async def plan(inp: object) -> ActionPlan:
            self.calls.append("plan")
            isolates = self.action is Action.ISOLATE_AND_RESTART
            return ActionPlan(
                request_id="r1",
                action=self.action,
                mode=self.mode,
                drain_nodes=["n2"] if isolates else [],
                exclude_nodes=["n2"],
                suspect_nodes=[] if isolates else ["n2"],
                job_id="7",
                expected_restart_count=0,
                needs_override=self.needs_override,
                guards=[
                    GuardDecision(
                        guard="blast_radius",
                        allowed=not self.needs_override,
                        detail="1 out of service by Relaunch in 24 h + 1 new, limit 1",
                    )
                ],
            )

        def step(name: str) -> object:
            @activity.defn(name=name)
            async def run(inp: ActInput) -> StepOutcome:
                self.calls.append(name)
                if name == "isolate" and not self.isolate_ok:
                    return StepOutcome(ok=False, detail="blast_radius: REFUSED at drain time")
                return StepOutcome(ok=True, changed=True, detail=f"{name} done")

            return run

        @activity.defn(name="verify_check")
        async def verify_check(inp: VerifyInput) -> VerifyCheck:
            self.calls.append("verify")
            return VerifyCheck(done=True, detail="RUNNING on n1,n3")

        @activity.defn(name="investigate")
        async def investigate(inp: GatherInput) -> Investigation:
            evidence = await gather_evidence(inp)
            verdict = await attribute(
                AttributeInput(incident_id=inp.incident_id, bundle_path=evidence.bundle_path)
            )
            # These recoveries plan their own (tests/unit/test_node_decision.py joins decisions).
            return Investigation(evidence=evidence, verdict=verdict, joined=Joined())

        return [
            record_detection,
            record_event,
            plan,
            step("isolate"),
            step("restart"),
            step("hold"),
            verify_check,
            investigate,
        ]


@pytest.fixture
async def env(temporal_client: Client) -> AsyncIterator[tuple[Client, str]]:
    yield temporal_client, f"wf-test-{uuid.uuid4().hex[:8]}"


async def start(
    client: Client, queue: str, policy: Policy
) -> WorkflowHandle[RecoveryWorkflow, RecoveryStatus]:
    det = Detection(
        cluster="unit",
        job_id="7",
        attempt=0,
        source=DetectionSource.SCHEDULER,
        kind="job_state:NODE_FAIL",
        detected_at=datetime.now(UTC),
    )
    return await client.start_workflow(
        RecoveryWorkflow.run,
        RecoveryInput(cluster="unit", job_id="7", attempt=0, policy=policy),
        id=f"relaunch-unit-7-0-{queue}",
        task_queue=queue,
        start_signal=RecoveryWorkflow.detection.__name__,
        start_signal_args=[det],
    )


async def wait_awaiting(handle: WorkflowHandle[RecoveryWorkflow, RecoveryStatus]) -> RecoveryStatus:
    import asyncio

    for _ in range(100):
        status = await handle.query(RecoveryWorkflow.status)
        if status.awaiting_approval:
            return status
        await asyncio.sleep(0.1)
    raise AssertionError("never awaited approval")


async def test_monitor_mode_acts_only_after_approval(env: tuple[Client, str]) -> None:
    client, queue = env
    fakes = Fakes()
    async with Worker(
        client, task_queue=queue, workflows=[RecoveryWorkflow], activities=fakes.activities()
    ):
        handle = await start(client, queue, Policy())
        status = await wait_awaiting(handle)
        assert status.stage is Stage.AWAITING_APPROVAL and status.plan is not None
        assert status.approval_deadline is not None
        assert "isolate" not in fakes.calls and "restart" not in fakes.calls
        await handle.signal(RecoveryWorkflow.approve, Approval(by="ana", reason="go"))
        result = await handle.result()
    assert result.stage is Stage.DONE and result.decided_by == "ana"
    assert fakes.calls[-3:] == ["isolate", "restart", "verify"]
    decision = [e for e in fakes.events if e["kind"] == "approval"]
    assert decision and decision[0]["actor"] == "ana"


async def test_rejection_records_who_and_does_nothing(env: tuple[Client, str]) -> None:
    client, queue = env
    fakes = Fakes()
    async with Worker(
        client, task_queue=queue, workflows=[RecoveryWorkflow], activities=fakes.activities()
    ):
        handle = await start(client, queue, Policy())
        await wait_awaiting(handle)
        await handle.signal(RecoveryWorkflow.reject, Approval(by="bob", reason="not now"))
        result = await handle.result()
    assert result.stage is Stage.REJECTED
    assert not {"isolate", "restart", "hold"} & set(fakes.calls)
    rejection = [e for e in fakes.events if e["kind"] == "rejection"]
    assert rejection[0]["actor"] == "bob" and "not now" in str(rejection[0]["summary"])


async def test_expiry_takes_no_action(env: tuple[Client, str]) -> None:
    client, queue = env
    fakes = Fakes()
    async with Worker(
        client, task_queue=queue, workflows=[RecoveryWorkflow], activities=fakes.activities()
    ):
        handle = await start(client, queue, Policy(approval_timeout_s=1))
        result = await handle.result()
    assert result.stage is Stage.EXPIRED
    assert not {"isolate", "restart", "hold"} & set(fakes.calls)


async def test_autonomous_acts_and_hold_needs_no_approval(env: tuple[Client, str]) -> None:
    client, queue = env
    auto = Fakes(mode=Mode.AUTONOMOUS)
    held = Fakes(action=Action.HOLD)
    async with Worker(
        client, task_queue=queue, workflows=[RecoveryWorkflow], activities=auto.activities()
    ):
        assert (await (await start(client, queue, Policy())).result()).stage is Stage.DONE
    assert auto.calls[-3:] == ["isolate", "restart", "verify"]
    queue2 = queue + "-hold"
    async with Worker(
        client, task_queue=queue2, workflows=[RecoveryWorkflow], activities=held.activities()
    ):
        # Monitor mode holds without asking only where the policy says so (auto_actions).
        policy = Policy(auto_actions=[AutoAction.HOLD])
        result = await (await start(client, queue2, policy)).result()
    assert result.stage is Stage.HELD
    assert "hold" in held.calls and "isolate" not in held.calls


async def test_approval_before_the_recommendation_is_ignored(env: tuple[Client, str]) -> None:
    client, queue = env
    fakes = Fakes(action=Action.NONE)
    async with Worker(
        client, task_queue=queue, workflows=[RecoveryWorkflow], activities=fakes.activities()
    ):
        handle = await start(client, queue, Policy())
        await handle.signal(RecoveryWorkflow.approve, Approval(by="eager"))
        result = await handle.result()
    assert result.stage is Stage.NO_ACTION and result.decided_by is None


async def run_fakes(
    client: Client, queue: str, fakes: Fakes, approve: Approval | None = None
) -> RecoveryStatus:
    async with Worker(
        client, task_queue=queue, workflows=[RecoveryWorkflow], activities=fakes.activities()
    ):
        handle = await start(client, queue, Policy())
        if approve is not None:
            await wait_awaiting(handle)
            await handle.signal(RecoveryWorkflow.approve, approve)
        return await handle.result()


async def test_autonomous_mode_never_overrides_a_guard(env: tuple[Client, str]) -> None:
    client, queue = env
    fakes = Fakes(mode=Mode.AUTONOMOUS, needs_override=True)
    result = await run_fakes(client, queue, fakes)
    assert result.stage is Stage.HELD and "blast_radius" in result.outcome
    assert "hold" in fakes.calls and not {"isolate", "restart"} & set(fakes.calls)
    held = [e for e in fakes.events if e["kind"] == "stage" and e["stage"] == "held"]
    assert held and "guard refused" in str(held[0]["summary"])  # what the notification says


async def test_monitor_mode_asks_a_human_to_override_a_refused_guard(
    env: tuple[Client, str],
) -> None:
    client, queue = env
    fakes = Fakes(needs_override=True)
    result = await run_fakes(client, queue, fakes, Approval(by="ana", reason="n2 is dead"))
    asked = [e for e in fakes.events if e.get("stage") == "awaiting_approval"]
    assert "approving overrides it" in str(asked[0]["summary"])
    approval = next(e for e in fakes.events if e["kind"] == "approval")
    assert approval["actor"] == "ana" and "override approved by ana" in str(approval["summary"])
    assert approval["data"]["override"] is True  # type: ignore[index]
    assert result.stage is Stage.DONE
    assert fakes.calls[-3:] == ["isolate", "restart", "verify"]


async def test_a_plain_approval_is_not_recorded_as_an_override(env: tuple[Client, str]) -> None:
    client, queue = env
    fakes = Fakes()
    await run_fakes(client, queue, fakes, Approval(by="ana"))
    approval = next(e for e in fakes.events if e["kind"] == "approval")
    assert "override" not in approval["data"]  # type: ignore[operator]


async def test_a_drain_refused_at_drain_time_holds_the_job(env: tuple[Client, str]) -> None:
    """Another recovery drained first and took the last place under the cap: this one holds
    the job for a human instead of restarting it with its culprit still in service."""
    client, queue = env
    fakes = Fakes(mode=Mode.AUTONOMOUS, isolate_ok=False)
    result = await run_fakes(client, queue, fakes)
    assert result.stage is Stage.HELD and "REFUSED at drain time" in result.outcome
    assert fakes.calls[-2:] == ["isolate", "hold"] and "restart" not in fakes.calls


async def test_exclude_and_restart_drains_nothing_and_records_the_suspects(
    env: tuple[Client, str],
) -> None:
    client, queue = env
    fakes = Fakes(action=Action.EXCLUDE_AND_RESTART, mode=Mode.AUTONOMOUS)
    result = await run_fakes(client, queue, fakes)
    assert result.stage is Stage.DONE
    assert "isolate" not in fakes.calls and fakes.calls[-2:] == ["restart", "verify"]
    suspects = [e for e in fakes.events if e["kind"] == "suspect"]
    assert [s["nodes"] for s in suspects] == [["n2"]]
