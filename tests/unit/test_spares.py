"""Spare nodes and the job's own launcher (docs/spares.md): the job's `train_nodes` setting, the
plan that trains again on a spare instead of a requeue, the launchers' health files as NVRx's
ft_launcher reads them, the launcher seen in a job's output, and the spare actions' command
lines against a recording Slurm."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

import pytest

from relaunch.activities.actions import ActionActivities
from relaunch.activities.deps import Deps
from relaunch.connectors.launcher_health import (
    CONVICTION_HOLD_S,
    FitFiles,
    LauncherHealth,
)
from relaunch.connectors.slurm.commands import SlurmCli
from relaunch.connectors.slurm.runner import CommandResult
from relaunch.connectors.slurm.spares import ShrinkRefusedError
from relaunch.detection.launchers import launcher_of
from relaunch.detection.planning import PlanHistory, make_plan, node_decision_nodes
from relaunch.models.config import ClusterConfig
from relaunch.models.errors import InvalidNameError
from relaunch.models.recovery import (
    Action,
    Category,
    EvidenceSummary,
    JobSnapshot,
    LauncherLookInput,
    Policy,
    RecoveryInput,
    RestartMethod,
    Verdict,
)
from relaunch.models.scheduler import Job, JobState, Node, NodeState, spare_left
from relaunch.workflows.launcher_watch import launcher_may_restart
from tests.support.fake_scheduler import FakeScheduler


def job(comment: str) -> Job:
    return Job(job_id="7", name="t", state=JobState.RUNNING, comment=comment)


@pytest.mark.parametrize(
    ("comment", "train"),
    [
        ("relaunch=on,train_nodes=2", 2),
        ("relaunch=on, train_nodes=16 ", 16),
        ("relaunch=on", None),
        ("relaunch=on,train_nodes=0", None),
        ("relaunch=on,train_nodes=-1", None),
        ("relaunch=on,train_nodes=two", None),
        ("relaunch=on,train_nodes=٣", None),  # a digit, not an ASCII one
        ("relaunch=on,train_nodes=9999999", None),
        ("relaunch=on,train_nodes=2\n", None),  # a control character: no option at all
    ],
)
def test_train_nodes_is_read_from_the_jobs_comment_and_nothing_else(
    comment: str, train: int | None
) -> None:
    assert job(comment).train_nodes == train


def snapshot(nodes: list[str], train: int | None, state: str = "RUNNING") -> JobSnapshot:
    return JobSnapshot(job_id="7", partition="gpu", nodes=nodes, state=state, train_nodes=train)


def test_a_spare_is_left_only_where_enough_nodes_stay_to_train_on() -> None:
    three = snapshot(["n1", "n2", "n3"], 2)
    assert three.spare_left(["n2"])
    assert not three.spare_left(["n2", "n3"])  # one node would be left, two train
    assert not three.spare_left(["n9"])  # nothing of the job's leaves it
    assert not three.spare_left([])
    assert not snapshot(["n1", "n2"], 2).spare_left(["n2"])  # no spare
    assert not snapshot(["n1", "n2", "n3"], None).spare_left(["n2"])  # no setting
    assert not snapshot(["n1", "n2", "n3"], 2, "COMPLETING").spare_left(["n2"])


def plan_for(
    evidence_job: JobSnapshot, category: Category, culprits: list[str], *, trusted: bool = True
) -> tuple[EvidenceSummary, Verdict]:
    verdict = Verdict(
        category=category,
        culprit_nodes=culprits,
        confidence=0.9,
        action=Action.NONE,
        corroboration={n: ["kernel_log"] if trusted else [] for n in culprits},
    )
    return EvidenceSummary(incident_id="i", bundle_path="/b", job=evidence_job), verdict


def make(evidence: EvidenceSummary, verdict: Verdict, policy: Policy | None = None):  # type: ignore[no-untyped-def]
    return make_plan(
        request_id="r",
        verdict=verdict,
        evidence=evidence,
        policy=policy or Policy(),
        history=PlanHistory.model_validate({"partition_size": 40}),
    )


def test_a_convicted_node_of_a_job_with_a_spare_leaves_it_instead_of_a_requeue() -> None:
    evidence, verdict = plan_for(snapshot(["n1", "n2", "n3"], 2), Category.GPU_HARDWARE, ["n2"])
    p = make(evidence, verdict)
    assert p.action is Action.ISOLATE_AND_RESTART
    assert p.restart_method is RestartMethod.SPARE
    assert p.drain_nodes == ["n2"] and p.exclude_nodes == ["n2"]
    assert any("trains again on a spare" in r for r in p.reasons)
    # Nor does its recovery join the node's decision (which would requeue the job).
    assert node_decision_nodes(verdict, evidence, Policy()) == []


def test_no_spare_left_restarts_the_whole_job_as_before() -> None:
    evidence, verdict = plan_for(snapshot(["n1", "n2"], 2), Category.GPU_HARDWARE, ["n2"])
    p = make(evidence, verdict)
    assert p.restart_method is RestartMethod.REQUEUE
    assert node_decision_nodes(verdict, evidence, Policy()) == ["n2"]
    # A resubmitting policy keeps its method where no spare is left.
    assert make(
        evidence, verdict, Policy(restart_method=RestartMethod.RESUBMIT)
    ).restart_method is (RestartMethod.RESUBMIT)


def test_job_output_alone_never_takes_a_node_out_of_the_job_but_a_suspect_may() -> None:
    """A suspect (named by the job's own output) is excluded, not drained: with a spare, the
    job still trains again without it, its own choice, and nobody else's node is touched."""
    evidence, verdict = plan_for(
        snapshot(["n1", "n2", "n3"], 2), Category.NETWORK, ["n2"], trusted=False
    )
    p = make(evidence, verdict)
    assert p.drain_nodes == [] and p.suspect_nodes == ["n2"]


def test_an_application_error_never_trains_on_a_spare() -> None:
    evidence, verdict = plan_for(snapshot(["n1", "n2", "n3"], 2), Category.APPLICATION, ["n2"])
    p = make(evidence, verdict)
    assert p.action is Action.HOLD and p.restart_method is RestartMethod.REQUEUE
    assert p.drain_nodes == []


def test_the_watcher_never_requeues_ahead_a_job_that_trains_again_on_a_spare() -> None:
    three = Job(
        job_id="7", name="t", state=JobState.RUNNING, nodes=["n1", "n2", "n3"],
        comment="relaunch=on,train_nodes=2",
    )  # fmt: skip

    def left(job: Job) -> bool:  # as the watcher asks it of each job on a reported node
        return spare_left(job.nodes, job.train_nodes, ["n2"])

    assert left(three)
    assert not left(three.model_copy(update={"nodes": ["n1", "n2"]}))
    assert not left(three.model_copy(update={"comment": "relaunch=on"}))


# ------------------------------------------------------------------ the launchers' health files


def launcher_check(path: Path) -> bool:
    """NVRx ft_launcher's pre-rendezvous storage check (v0.6.0+,
    ``--ft-storage-health-check-path``; shared_utils/storage_probe.py): the path exists and up
    to 4096 bytes of it read; anything else makes the node unhealthy."""
    try:
        with open(path, "rb") as fh:
            fh.read(4096)
    except OSError:
        return False
    return os.path.exists(path)


def test_a_node_is_fit_until_convicted_and_the_launcher_reads_it_so(tmp_path: Path) -> None:
    health = LauncherHealth(str(tmp_path / "health" / "{node}"))
    assert health.mark_fit("n1") and health.mark_fit("n2")
    assert not health.mark_fit("n1")  # there already
    assert launcher_check(health.path("n1")) and launcher_check(health.path("n2"))
    assert health.flag("n2", incident="relaunch-dev-7-0", reason="convicted of gpu_hardware")
    assert not launcher_check(health.path("n2")) and launcher_check(health.path("n1"))
    note = json.loads((tmp_path / "health" / "n2.unhealthy").read_text())
    assert note["incident"] == "relaunch-dev-7-0" and note["node"] == "n2"
    assert not health.flag("n2", incident="again", reason="x")  # idempotent: gone already
    assert json.loads((tmp_path / "health" / "n2.unhealthy").read_text())["incident"] == (
        "relaunch-dev-7-0"
    )


def test_a_fresh_conviction_is_not_undone_by_a_watcher_pass_before_the_drain(
    tmp_path: Path,
) -> None:
    health = LauncherHealth(str(tmp_path / "{node}"))
    health.mark_fit("n2")
    health.flag("n2", incident="i", reason="r")
    marker = tmp_path / "n2.unhealthy"
    # Slurm still lists n2 in service for a moment: the file stays away...
    assert not health.mark_fit("n2", now=marker.stat().st_mtime + 1)
    assert not health.fit("n2")
    # ...and once the node is back in service long after, it is fit again, the note gone.
    assert health.mark_fit("n2", now=marker.stat().st_mtime + CONVICTION_HOLD_S + 1)
    assert health.fit("n2") and not marker.exists()


def test_the_watcher_writes_files_only_for_nodes_in_service_and_not_every_pass(
    tmp_path: Path,
) -> None:
    health = LauncherHealth(str(tmp_path / "{node}"))
    fit = FitFiles(health)
    nodes = [
        Node(name="n1", state=NodeState.IDLE),
        Node(name="n2", state=NodeState.ALLOCATED, flags=["DRAIN"]),
        Node(name="n3", state=NodeState.DOWN),
    ]
    fit.observe(nodes, now=100.0)
    assert [health.fit(n) for n in ("n1", "n2", "n3")] == [True, False, False]
    health.path("n1").unlink()
    fit.observe(nodes, now=110.0)  # looked at 10 s ago: not again yet
    assert not health.fit("n1")
    fit.observe(nodes, now=131.0)
    assert health.fit("n1") and fit.written == 2


def test_a_health_path_needs_a_node_and_never_takes_a_name_that_leaves_it(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        LauncherHealth("relative/{node}")
    with pytest.raises(ValueError):
        LauncherHealth(str(tmp_path / "no-node"))
    with pytest.raises(InvalidNameError):
        LauncherHealth(str(tmp_path / "{node}")).path("../etc/passwd")


@pytest.mark.parametrize(
    ("text", "launcher"),
    [
        (
            "0: E1205 16:54:32.962000 23682 torch/distributed/elastic/multiprocessing/api.py:1002]"
            " failed (exitcode: 1) local_rank: 0 (pid: 23732) of binary: python",
            "torchrun",
        ),
        ("[default0]:... nvidia_resiliency_ext.fault_tolerance.launcher ...", "ft_launcher"),
        ("step=12 loss=0.5 rank=0 node=n1\nTraceback (most recent call last):", ""),
    ],
)
def test_the_launcher_is_seen_in_its_own_lines(text: str, launcher: str) -> None:
    assert launcher_of(text) == launcher


# ------------------------------------------------------------------ the spare actions' commands


class SmallSlurm:
    """A runner answering squeue, scontrol and scancel for one running job on n1-n3."""

    def __init__(self, *, refuse_shrink: bool = False) -> None:
        self.nodes = ["n1", "n2", "n3"]
        self.steps = ["7.0", "7.batch", "7.extern"]
        self.argvs: list[list[str]] = []
        self.refuse_shrink = refuse_shrink

    async def run(
        self, argv: Sequence[str], *, stdin: str | None = None, timeout: float | None = None
    ) -> CommandResult:
        argv = list(argv)
        self.argvs.append(argv)
        if argv[:2] == ["scontrol", "update"]:
            if self.refuse_shrink:
                return CommandResult(tuple(argv), 1, "", "Invalid node name specified", 0.0)
            self.nodes = argv[3].split("=", 1)[1].split(",")
            return CommandResult(tuple(argv), 0, "", "", 0.0)
        if argv[0] == "scancel":
            self.steps = [s for s in self.steps if s not in argv[1:]]
            return CommandResult(tuple(argv), 0, "", "", 0.0)
        if "--steps" in argv:
            return CommandResult(tuple(argv), 0, "\n".join(self.steps) + "\n", "", 0.0)
        return CommandResult(tuple(argv), 0, "", "", 0.0)


class Cli(SlurmCli):
    def __init__(self, runner: SmallSlurm) -> None:
        super().__init__(runner=runner)  # type: ignore[arg-type]
        self.small = runner

    async def get_job(self, job_id: str) -> Job:
        return Job(job_id=job_id, name="t", state=JobState.RUNNING, nodes=list(self.small.nodes))


async def test_a_node_leaves_the_job_then_its_steps_end_each_once() -> None:
    slurm = SmallSlurm()
    spares = Cli(slurm).spares()
    steps = await spares.steps("7")
    assert steps == ["7.0"]  # never the batch script or the extern step
    shrunk = await spares.leave("7", ["n2"])
    assert shrunk.changed and slurm.nodes == ["n1", "n3"]
    assert ["scontrol", "update", "JobId=7", "NodeList=n1,n3"] in slurm.argvs
    assert not (await spares.leave("7", ["n2"])).changed  # already out: not asked again
    ended = await spares.end_steps("7", steps)
    assert ended.changed and ["scancel", "7.0"] in slurm.argvs
    slurm.steps.append("7.1")  # the job's script started its step again
    again = await spares.end_steps("7", steps)
    assert not again.changed and "7.1" in slurm.steps  # a retry never ends the new step


async def test_slurm_keeping_the_node_is_said_and_a_wrong_step_id_never_reaches_scancel() -> None:
    spares = Cli(SmallSlurm(refuse_shrink=True)).spares()
    with pytest.raises(ShrinkRefusedError, match="Invalid node name"):
        await spares.leave("7", ["n1"])
    slurm = SmallSlurm()
    await Cli(slurm).spares().end_steps("7", ["8.0", "7.0;rm -rf /", "7.batch"])
    assert not any(a[0] == "scancel" for a in slurm.argvs)


# ------------------------------------------------------------------ the launcher's turn


def recovery_input(grace: float = 60.0) -> RecoveryInput:
    return RecoveryInput(
        cluster="dev", job_id="42", attempt=0, policy=Policy(launcher_grace_s=grace)
    )


def launched(category: Category, *, state: str = "RUNNING", log_size: int = 100) -> bool:
    evidence = EvidenceSummary(
        incident_id="i",
        bundle_path="/b",
        job=JobSnapshot(job_id="42", state=state, nodes=["n1", "n2"], log_size=log_size),
    )
    verdict = Verdict(category=category, culprit_nodes=[], confidence=0.9, action=Action.HOLD)
    return launcher_may_restart(recovery_input(), verdict, evidence)


def test_only_an_application_error_in_a_running_job_read_from_its_file_waits() -> None:
    assert launched(Category.APPLICATION)
    assert not launched(Category.GPU_HARDWARE)  # a node's fault: acted on at once
    assert not launched(Category.HANG)
    assert not launched(Category.APPLICATION, state="FAILED")  # ended: nothing to restart it
    # Read from a log store: no mark of where its output stood, so no old resume may count.
    assert not launched(Category.APPLICATION, log_size=0)
    evidence = EvidenceSummary(
        incident_id="i", bundle_path="/b", job=JobSnapshot(job_id="42", state="RUNNING", log_size=9)
    )
    verdict = Verdict(category=Category.APPLICATION, culprit_nodes=[], confidence=0.9,
                      action=Action.HOLD)  # fmt: skip
    assert not launcher_may_restart(recovery_input(grace=0), verdict, evidence)


async def test_a_look_counts_only_a_resume_printed_since_the_evidence(tmp_path: Path) -> None:
    log = tmp_path / "train.out"
    before = "resumed from checkpoint step=5\nstep=6 loss=0.1 rank=0 node=n1\n"
    log.write_text(before + "RuntimeError: injected application error at step 12\n")
    offset = log.stat().st_size
    job = Job(
        job_id="42", name="t", state=JobState.RUNNING, nodes=["n1", "n2"],
        stdout_path=str(log), user="root", uid=0,
    )  # fmt: skip
    sched = FakeScheduler(jobs=[job])
    config = ClusterConfig(name="dev", database_url="postgresql://unused", bundle_dir="/tmp")
    actions = ActionActivities(Deps(config=config, scheduler=sched, audit=cast(Any, None)))
    look = LauncherLookInput(
        incident_id="i", cluster="dev", job_id="42", restart_count=0, since_offset=offset,
        launcher="",
    )  # fmt: skip
    seen = await actions.launcher_look(look)
    assert not seen.trained_again and not seen.ended  # the old resume is before the mark
    log.write_text(
        log.read_text()
        + "E1205 torch/distributed/elastic/multiprocessing/api.py:1002] failed\n"
        + "resumed from checkpoint step=10\nstep=11 loss=0.2 rank=0 node=n1\n"
    )
    seen = await actions.launcher_look(look)
    assert seen.trained_again and seen.launcher == "torchrun"
    assert (seen.resumed_step, seen.latest_step) == (10, 11)
    sched.jobs["42"] = job.model_copy(update={"restart_count": 1, "state": JobState.PENDING})
    assert (await actions.launcher_look(look)).ended  # requeued: no longer its launcher's
