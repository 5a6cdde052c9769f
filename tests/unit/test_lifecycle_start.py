"""Where a drained node's lifecycle starts (`lifecycle_start`): its ladder, and the rules that
send it straight to repair."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from temporalio.testing import ActivityEnvironment

from relaunch.activities.deps import Deps
from relaunch.activities.lifecycle import LifecycleActivities
from relaunch.connectors.audit import NodeReputation, StoredEvent
from relaunch.models.config import ClusterConfig
from relaunch.models.lifecycle import LifecycleFault, LifecycleSettings, Rung, StartInput
from relaunch.models.recovery import Category, Policy
from relaunch.models.scheduler import NodeState
from tests.support.fake_scheduler import FakeScheduler

NOW = datetime.now(UTC)
LID = "relaunch-c-lifecycle-n1-3"


class Audit:
    """The two reads `lifecycle_start` makes of the audit trail."""

    def __init__(self, rows: list[StoredEvent], reputation: list[NodeReputation]) -> None:
        self.rows, self.reputation = rows, reputation

    async def node_lifecycle_events(self, *_: Any) -> list[StoredEvent]:
        return self.rows

    async def node_reputation(self, *_: Any) -> list[NodeReputation]:
        return self.reputation


def row(incident: str, what: str, stage: str | None = None, **data: Any) -> StoredEvent:
    return StoredEvent(
        id=1, incident_id=incident, kind=what, at=NOW - timedelta(hours=1), stage=stage,
        nodes=["n1"], data=data,
    )  # fmt: skip


def start(
    rows: list[StoredEvent] = (),  # type: ignore[assignment]
    reputation: list[NodeReputation] = (),  # type: ignore[assignment]
    remedy: str | None = "reboot",
    state: NodeState = NodeState.DOWN,
    flags: tuple[str, ...] = ("DRAIN",),
) -> Any:
    sched = FakeScheduler()
    sched.set_node("n1", state=state, flags=list(flags), reason="relaunch incident x")
    config = ClusterConfig(
        name="c", database_url="postgresql://x", bundle_dir="/tmp", policy=Policy()
    )
    deps = Deps(config=config, scheduler=sched, audit=Audit(list(rows), list(reputation)))  # type: ignore[arg-type]
    fault = LifecycleFault(
        incident_id="relaunch-c-node-n1-3", category=Category.GPU_HARDWARE, remedy=remedy,
        kind=f"gpu_hardware/{remedy}", at=NOW,
    )  # fmt: skip
    inp = StartInput(
        lifecycle_id=LID, cluster="c", node="n1", settings=LifecycleSettings(), fault=fault
    )
    return ActivityEnvironment().run(LifecycleActivities(deps).start, inp)


async def test_a_first_fault_climbs_its_ladder() -> None:
    got = await start()
    assert got.drained and got.ladder == [Rung.REBOOT, Rung.ESCALATE] and got.escalate == ""


async def test_a_node_returned_recently_and_failing_again_goes_to_repair() -> None:
    got = await start([row("relaunch-c-lifecycle-n1-2", "node_stage", "returned")])
    assert got.escalate.startswith("returned to service by relaunch-c-lifecycle-n1-2")


async def test_the_same_fault_twice_in_the_window_goes_to_repair() -> None:
    earlier = row("relaunch-c-lifecycle-n1-1", "lifecycle_fault", kind="gpu_hardware/reboot")
    got = await start([earlier])
    assert got.escalate == "gpu_hardware/reboot 2 times within 168 h"
    other = row("relaunch-c-lifecycle-n1-1", "lifecycle_fault", kind="network/none")
    assert (await start([other])).escalate == ""


async def test_the_catalogue_and_a_repeat_offender_go_to_repair() -> None:
    assert "Xid catalogue" in (await start(remedy="escalate")).escalate
    rep = NodeReputation(node="n1", incidents=3, jobs=3, last_at=NOW)
    assert (await start(reputation=[rep])).escalate.startswith("a repeat offender: 3 incidents")
    fewer = NodeReputation(node="n1", incidents=2, jobs=2, last_at=NOW)
    assert (await start(reputation=[fewer])).escalate == ""


async def test_a_node_back_in_service_is_left_alone() -> None:
    got = await start(state=NodeState.IDLE, flags=())
    assert not got.drained and got.state == "IDLE"  # someone resumed it: the lifecycle closes
