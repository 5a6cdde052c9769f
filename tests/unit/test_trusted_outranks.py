"""Issue 29 rows 4, 5 and 9 (POWER_DOWN), as rules: what the job writes (banners, progress,
its own error lines) and what an untrusted sender pushes never hide a node that Relaunch's
probes or Slurm's node state convict, and never restart a job that still runs and advances with
no trusted fault; a recovery that took no action does not swallow a later fault of the same
attempt (recovery_client.current_recovery). Real-stack: tests/adversarial/test_trusted_outranks.py.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

import pytest
from temporalio.client import WorkflowExecutionStatus
from temporalio.common import SearchAttributePair, TypedSearchAttributes
from temporalio.service import RPCError, RPCStatusCode

from relaunch.connectors.slurm.commands import SlurmCli
from relaunch.connectors.slurm.runner import CommandResult
from relaunch.detection.attribution import attribute_bundle
from relaunch.detection.planning import PlanHistory, make_plan
from relaunch.models.bundle import Bundle, BundleJob, HealthReport
from relaunch.models.errors import ControllerUnavailableError, SchedulerError
from relaunch.models.recovery import (
    Action,
    ActionPlan,
    Category,
    Detection,
    DetectionSource,
    EvidenceSummary,
    JobSnapshot,
    Policy,
    Stage,
    Verdict,
)
from relaunch.workflows import recovery_client

NODES = ["n1", "n2", "n3"]
T = datetime(2026, 12, 4, 22, 0, tzinfo=UTC)
CANCEL = "slurmstepd: error: *** JOB 7 ON n1 CANCELLED AT 2026-12-04T21:59:00 ***\n"
STEP_CANCEL = "slurmstepd: error: *** STEP 7.0 ON n1 CANCELLED AT 2026-12-04T21:59:00 ***\n"
PREEMPT = (
    "slurmstepd: error: *** JOB 7 ON n1 CANCELLED AT 2026-12-04T21:59:00 DUE TO PREEMPTION ***\n"
)
# Job-written noise around a dead node: another node named failed, another job's banner.
NOISE = [
    "",
    "srun: error: Node failure on n3\n",
    "slurmstepd: error: *** JOB 1 ON n3 CANCELLED AT 2026-12-04T21:59:00 ***\n",
    "n3:1:1 [0] NCCL WARN NET/IB : Got async fatal event: local catastrophic error\n",
]
PROGRESS = "".join(f"step={i} loss=0.5\n" for i in range(1, 21))
WATCHDOG = (
    "[rank0]:[E1204 21:59:00.1 ProcessGroupNCCL.cpp:697] [Rank 0] Watchdog caught collective "
    "operation timeout: WorkNCCL(SeqNum=9, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, "
    "Timeout(ms)=600000) ran for 600000 milliseconds before timing out.\n"
)
XID79 = (
    "2026-12-04T21:58:00+00:00 n2 kernel: NVRM: Xid (PCI:0000:3b:00): 79, pid=1, "
    "GPU has fallen off the bus.\n"
)


def bundle(
    log: str = "",
    *,
    state: str = "RUNNING",
    health: list[HealthReport] | None = None,
    node_logs: dict[str, str] | None = None,
    **job: object,
) -> Bundle:
    return Bundle(
        path="mem",
        job=BundleJob(
            cluster="c",
            job_id="7",
            state=state,
            nodes=NODES,
            observed_at=T,
            submit_time=T - timedelta(hours=1),
            **{"node_states": dict.fromkeys(NODES, "ALLOCATED"), **job},
        ),
        job_log=log,
        health=health or [],
        node_logs=node_logs or {},
    )


def plan_for(b: Bundle, verdict: Verdict, history: PlanHistory | None = None) -> ActionPlan:
    return make_plan(
        request_id="r",
        verdict=verdict,
        evidence=EvidenceSummary(
            incident_id="i",
            bundle_path="/b",
            job=JobSnapshot(job_id="7", state=b.job.state, nodes=NODES, restart_count=0),
            node_states=b.job.node_states,
            unreachable_nodes=b.job.unreachable_nodes,
        ),
        policy=Policy(),
        history=history or PlanHistory(partition_size=40),
    )


def convicted(b: Bundle, node: str, source: str) -> ActionPlan:
    """The verdict convicts ``node`` on ``source`` and the plan drains it (and only it)."""
    v = attribute_bundle(b)
    assert node in v.culprit_nodes and source in v.corroboration[node], v
    assert v.action is Action.ISOLATE_AND_RESTART, v
    p = plan_for(b, v)
    assert p.drain_nodes == [node], p
    return p


# ------------------------------------------------------------------ row 4: banners


@pytest.mark.parametrize("state", ["RUNNING", "COMPLETING", ""])
@pytest.mark.parametrize("banner", [CANCEL, STEP_CANCEL])
def test_a_printed_own_cancel_banner_does_not_hide_an_unreachable_node(
    banner: str, state: str
) -> None:
    p = convicted(bundle(banner, state=state, unreachable_nodes=["n2"]), "n2", "probe")
    assert p.action is Action.ISOLATE_AND_RESTART and not p.job_cancelled


def test_a_real_cancel_still_drains_an_unreachable_node_and_does_not_restart_the_job() -> None:
    """The user's scancel (an error trap's) is trusted about the job, not about its nodes."""
    b = bundle(CANCEL, state="CANCELLED", unreachable_nodes=["n2"])
    p = convicted(b, "n2", "probe")
    assert p.job_cancelled and p.fence_nodes == ["n2"]
    assert any("not restarted" in r for r in p.reasons), p.reasons
    assert [g.guard for g in p.guards] == ["blast_radius"]  # no restart, no restart budget
    # A real cancel with all nodes healthy is still a user cancel: nothing is done.
    plain = attribute_bundle(bundle(CANCEL, state="CANCELLED"))
    assert plain.category is Category.USER_CANCEL and plain.action is Action.NONE
    assert plan_for(bundle(state="CANCELLED"), plain).action is Action.NONE


@pytest.mark.parametrize("down", ["DOWN+NOT_RESPONDING", "ALLOCATED+NOT_RESPONDING", "DOWN*"])
def test_a_printed_preemption_banner_does_not_hide_slurms_down_node(down: str) -> None:
    states = {**dict.fromkeys(NODES, "ALLOCATED"), "n2": down}
    convicted(bundle(PREEMPT, node_states=states), "n2", "slurm_node_state")
    # With no trusted fault the banners still decide, and Slurm's own PREEMPTED state decides
    # whatever the nodes say (Slurm requeues or ends the job itself).
    assert attribute_bundle(bundle(CANCEL)).category is Category.USER_CANCEL
    assert attribute_bundle(bundle(PREEMPT)).category is Category.PREEMPTION
    v = attribute_bundle(bundle(PREEMPT, state="PREEMPTED", node_states=states))
    assert v.category is Category.PREEMPTION and v.action is Action.NONE


# ------------------------------------------------------ controls, with and without noise


@pytest.mark.parametrize("noise", NOISE, ids=["quiet", "node-failure", "foreign-banner", "nccl"])
def test_unreachable_and_down_nodes_drain_with_and_without_job_noise(noise: str) -> None:
    convicted(bundle(noise, state="FAILED", unreachable_nodes=["n2"]), "n2", "probe")
    states = {**dict.fromkeys(NODES, "ALLOCATED"), "n2": "DOWN+NOT_RESPONDING"}
    convicted(bundle(noise, state="FAILED", node_states=states), "n2", "slurm_node_state")
    # ... and while the job still runs and advances: a trusted fault is acted on at once.
    running = bundle(PROGRESS + noise, progress_step=20, unreachable_nodes=["n2"])
    assert not attribute_bundle(running).still_running
    convicted(running, "n2", "probe")


# ------------------------------------------------------------ row 9: power saving


def test_power_saving_is_not_slurm_down() -> None:
    def culprit(state: str) -> list[str]:
        states = {**dict.fromkeys(NODES, "ALLOCATED"), "n2": state}
        return attribute_bundle(bundle(state="FAILED", node_states=states)).corroboration.get(
            "n2", []
        )

    for saving in ("IDLE+POWERED_DOWN", "MIXED+POWERING_DOWN", "IDLE+POWER_DOWN", "idle~"):
        assert culprit(saving) == [], saving
    # Down or failing, whatever else the state says, still counts.
    for down in ("DOWN+POWERED_DOWN", "IDLE+FAIL", "down~", "MIXED+FAILING", "idle*"):
        assert culprit(down) == ["slurm_node_state"], down


async def test_a_controller_named_like_power_down_is_not_down() -> None:
    """`scontrol ping` says whether slurmctld is DOWN; the word, not a substring of a name."""

    class Runner:
        def __init__(self, ping: str) -> None:
            self.ping = ping

        async def run(
            self, argv: Sequence[str], *, stdin: str | None = None, timeout: float = 30.0
        ) -> CommandResult:
            if list(argv) == ["scontrol", "ping"]:
                return CommandResult(tuple(argv), 0, self.ping, "", 0.0)
            return CommandResult(tuple(argv), 0, '{"errors": [{"error": "x"}], "jobs": []}', "", 0)

    up = SlurmCli(runner=Runner("Slurmctld(primary) at POWER_DOWN-ctl is UP\n"))
    with pytest.raises(SchedulerError) as info:
        await up.list_jobs()
    assert not isinstance(info.value, ControllerUnavailableError)
    down = SlurmCli(runner=Runner("Slurmctld(primary) at ctl is DOWN\n"))
    with pytest.raises(ControllerUnavailableError):
        await down.list_jobs()


# ------------------------------------------------- row 5: a running, advancing job


def untrusted_xid(node: str = "n2") -> HealthReport:
    return HealthReport(
        node=node,
        time=T - timedelta(minutes=1),
        component="GPU",
        check="SysLogsXIDError",
        error_codes=["79"],
        recommended_action="RESTART_BM",
        is_fatal=True,
        message="XID 79: GPU has fallen off the bus",
        sender="alerts",
        trusted=False,
    )


@pytest.mark.parametrize(
    ("log", "health"),
    [
        (WATCHDOG, []),  # a printed hang
        ("srun: error: Node failure on n3\n", []),  # a printed node failure
        ("", []),  # nothing at all: a RUNNING job with no root is judged a hang
        ("", [untrusted_xid()]),  # an untrusted sender's fatal event
    ],
    ids=["printed-hang", "printed-node-failure", "nothing", "untrusted-health-event"],
)
def test_a_running_advancing_job_without_a_trusted_fault_gets_no_action(
    log: str, health: list[HealthReport]
) -> None:
    b = bundle(PROGRESS + log, progress_step=20, health=health)
    v = attribute_bundle(b)
    assert v.still_running and v.action is Action.NONE, v
    assert "still runs and its ranks advance" in v.summary
    assert all(by == [] for by in v.corroboration.values())
    p = plan_for(b, v)
    assert p.action is Action.NONE and p.drain_nodes == [] and p.exclude_nodes == []
    assert any("still runs" in r for r in p.reasons)
    assert not p.restarts


def test_a_running_job_is_acted_on_when_it_stalled_or_a_trusted_source_names_a_fault() -> None:
    # The watcher measured a stall (last_progress_at): not advancing, a hang as before.
    stalled = bundle(
        PROGRESS + WATCHDOG, progress_step=20, last_progress_at=T - timedelta(minutes=2)
    )
    v = attribute_bundle(stalled)
    assert not v.still_running and v.category is Category.HANG and v.action is Action.RESTART
    # No progress printed: nothing says it advances.
    assert not attribute_bundle(bundle(WATCHDOG)).still_running
    # An application error the job reports about itself still holds it (no one else's job).
    app = attribute_bundle(bundle(PROGRESS + "1: RuntimeError: injected\n", progress_step=20))
    assert app.category is Category.APPLICATION and app.action is Action.HOLD
    assert not app.still_running
    # A trusted kernel Xid on one of its nodes.
    b = bundle(PROGRESS, progress_step=20, node_logs={"n2": XID79})
    assert not attribute_bundle(b).still_running
    convicted(b, "n2", "kernel_log")
    # A trusted sender's event.
    trusted = untrusted_xid().model_copy(update={"trusted": True, "sender": "nvsentinel"})
    convicted(bundle(PROGRESS, progress_step=20, health=[trusted]), "n2", "health_event")


def test_several_users_naming_the_node_never_act_on_a_job_that_still_runs() -> None:
    """Job output never convicts, however many users' jobs print it: a job still training is
    left alone (the node's checks come from a recovery that acts)."""
    b = bundle(PROGRESS + "srun: error: Node failure on n3\n", progress_step=20)
    v = attribute_bundle(b)
    assert v.still_running
    p = plan_for(b, v, PlanHistory(partition_size=40, suspected_by={"n3": ["ana", "bo"]}))
    assert p.action is Action.NONE and p.drain_nodes == [] and p.check_nodes == []


# ------------------------------------- a no-action recovery does not swallow a later fault


@dataclass
class Described:
    status: WorkflowExecutionStatus
    stage: str
    still_running: bool = True  # its verdict's: why it ended at no_action
    id: str = ""
    run_id: str = "run"

    @property
    def typed_search_attributes(self) -> TypedSearchAttributes:
        return TypedSearchAttributes([SearchAttributePair(recovery_client.SA_STAGE, self.stage)])


@dataclass
class Server:
    runs: dict[str, Described] = field(default_factory=dict)

    def get_workflow_handle(self, workflow_id: str, **_: object) -> Handle:
        return Handle(self, workflow_id)


@dataclass
class Handle:
    server: Server
    workflow_id: str

    async def describe(self) -> Described:
        if self.workflow_id not in self.server.runs:
            raise RPCError("not found", RPCStatusCode.NOT_FOUND, b"")
        return replace(self.server.runs[self.workflow_id], id=self.workflow_id)

    async def result(self) -> SimpleNamespace:
        ran = self.server.runs[self.workflow_id]
        return SimpleNamespace(verdict=SimpleNamespace(still_running=ran.still_running))


def det(source: DetectionSource) -> Detection:
    return Detection(cluster="c", job_id="7", attempt=0, source=source, kind="k", detected_at=T)


async def test_a_fault_after_a_no_action_recovery_opens_the_attempts_next_recovery() -> None:
    current_recovery = recovery_client.current_recovery
    done = WorkflowExecutionStatus.COMPLETED
    server = Server({"relaunch-c-7-0": Described(done, Stage.NO_ACTION.value)})
    client = server  # only get_workflow_handle(...).describe() is used
    for source in (DetectionSource.PROBE, DetectionSource.SCHEDULER, DetectionSource.PROGRESS):
        wid, latest = await current_recovery(client, det(source))  # type: ignore[arg-type]
        assert (wid, latest) == ("relaunch-c-7-0-r2", None)
    # The job's own output (or an untrusted sender) again: the ended recovery, as before.
    for source in (DetectionSource.JOB_LOG, DetectionSource.UNTRUSTED_HEALTH_EVENT):
        wid, _ = await current_recovery(client, det(source))  # type: ignore[arg-type]
        assert wid == "relaunch-c-7-0"
    # A running reopened recovery is joined; one that acted is never reopened.
    server.runs["relaunch-c-7-0-r2"] = Described(WorkflowExecutionStatus.RUNNING, "gathering")
    assert (await current_recovery(client, det(DetectionSource.PROBE)))[0] == "relaunch-c-7-0-r2"  # type: ignore[arg-type]
    server.runs["relaunch-c-7-0-r2"] = Described(done, Stage.DONE.value)
    assert (await current_recovery(client, det(DetectionSource.PROBE)))[0] == "relaunch-c-7-0-r2"  # type: ignore[arg-type]
    # A recovery that ended at no_action for a cancel (the job no longer runs) is the
    # attempt's last: a later fault on its node opens no recovery of that job.
    cancelled = Server({"relaunch-c-7-0": Described(done, Stage.NO_ACTION.value, False)})
    wid, latest = await current_recovery(cancelled, det(DetectionSource.NODE_LOG))  # type: ignore[arg-type]
    assert wid == "relaunch-c-7-0" and latest is not None
    # Bounded: at most MAX_RECOVERIES_PER_ATTEMPT recoveries of one attempt.
    cap = recovery_client.MAX_RECOVERIES_PER_ATTEMPT
    for n in range(2, cap + 1):
        server.runs[f"relaunch-c-7-0-r{n}"] = Described(done, Stage.NO_ACTION.value)
    wid, latest = await current_recovery(client, det(DetectionSource.PROBE))  # type: ignore[arg-type]
    assert wid == f"relaunch-c-7-0-r{cap}" and latest is not None
