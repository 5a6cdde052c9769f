"""The node lifecycle beside users (issue 29, row 8): no check starts on a node a job still
holds (Slurm's fresh view), the storage check writes only inside a private folder it makes,
and a failed check beside a user's process or job is inconclusive, never a reason for a rung.
The real stack's side: tests/adversarial/test_lifecycle_guard.py."""

from __future__ import annotations

import os
import socket
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from temporalio import activity
from temporalio.client import Client
from temporalio.testing import ActivityEnvironment

import relaunch.activities.lifecycle as lifecycle_activities
from relaunch.activities.deps import Deps
from relaunch.activities.lifecycle import LifecycleActivities
from relaunch.connectors.slurm.maintenance import parse_node_jobs
from relaunch.detection.health import (
    builtin_checks,
    foreign_jobs,
    inconclusive_reason,
    judge,
    split_census,
    wrapped_argv,
)
from relaunch.models.config import ClusterConfig
from relaunch.models.lifecycle import (
    CheckResult,
    CheckRun,
    ChecksInput,
    HealthCheck,
    LifecycleSettings,
    NodeJob,
    NodeStage,
)
from relaunch.models.recovery import Category, Mode
from relaunch.models.scheduler import JobState, NodeState
from tests.support.fake_scheduler import FakeScheduler
from tests.unit.test_lifecycle_workflow import NOW, Node, env, replays, run, until, worker

__all__ = ["env"]  # the Temporal dev server fixture, shared with the lifecycle's workflow tests


def job(
    job_id: str, uid: int | None, state: JobState = JobState.RUNNING, resv: str = ""
) -> NodeJob:
    return NodeJob(job_id=job_id, uid=uid, state=state, reservation=resv)


# ------------------------------------------------------------------ the rules


def test_a_job_still_on_the_node_keeps_the_checks_off_but_relaunchs_own_does_not() -> None:
    mine = job("7", 0, resv="relaunch-maint-n1")  # a check step: root's, in the reservation
    users = job("8", 1001)
    assert foreign_jobs([mine, users], "n1") == [users]
    assert foreign_jobs([mine], "n1") == []
    # Root outside the reservation, a completing job and one whose uid is unknown all hold it.
    held = [job("9", 0), job("10", 1001, JobState.COMPLETING), job("11", None)]
    assert foreign_jobs(held, "n1") == held
    # Another node's reservation is not this node's; pending and ended jobs hold nothing.
    other = job("12", 0, resv="relaunch-maint-n2")
    gone = [job("13", 1001, JobState.PENDING), job("14", 1001, JobState.COMPLETED)]
    assert foreign_jobs([other, *gone], "n1") == [other]


def test_squeue_rows_carry_only_slurms_fields_and_an_odd_row_still_holds_the_node() -> None:
    text = "41 1001 RUNNING (null)\n42 0 RUNNING relaunch-maint-n1\n43_2 1002 COMPLETING (null)\n"
    rows = parse_node_jobs(text + "garbage that is not four fields at all\n")
    assert [(r.job_id, r.uid, r.state, r.reservation) for r in rows[:3]] == [
        ("41", 1001, JobState.RUNNING, ""),
        ("42", 0, JobState.RUNNING, "relaunch-maint-n1"),
        ("43_2", 1002, JobState.COMPLETING, ""),
    ]
    assert rows[3].uid is None and rows[3].state is JobState.UNKNOWN
    assert [r.job_id for r in foreign_jobs(rows, "n1")] == ["41", "43_2", rows[3].job_id]


def test_the_census_finds_users_and_a_forged_line_can_only_add_one() -> None:
    out = "relaunch-census: 0 2 101 1001 65534\nok\nrelaunch-census: 0 1002\n"
    text, users = split_census(out, 1000)
    assert text == "ok\n" and users == [1001, 1002]  # nobody (65534) is not a user
    check = HealthCheck(id="c", argv=["x"], pass_pattern="^ok$")
    assert judge(check, 0, out).passed and judge(check, 0, out).users == [1001, 1002]
    assert split_census("relaunch-census: 0 x;rm 77\n", 1000)[1] == []
    assert split_census(out, 1000, ignore={1001})[1] == [1002]  # a service account: no user


def test_a_failure_beside_a_user_or_a_job_is_inconclusive_a_plain_failure_is_not() -> None:
    bad = CheckResult(id="dev-gpu", passed=False, detail="exit 1", users=[1001])
    good = CheckResult(id="node-basics", passed=True, detail="exit 0", users=[1001])
    assert "dev-gpu failed while processes of uid 1001" in inconclusive_reason([bad, good], [])
    assert inconclusive_reason([good], [job("8", 1001)]) == ""  # nothing failed
    alone = bad.model_copy(update={"users": []})
    assert inconclusive_reason([alone], []) == ""  # a fault of the node: the ladder decides
    assert "job 8 (uid 1001, RUNNING)" in inconclusive_reason([alone], [job("8", 1001)])
    run = CheckRun(
        results=[bad], purpose="diagnose", started_at=NOW, finished_at=NOW, inconclusive="x"
    )
    assert not run.passed and run.summary().startswith("inconclusive")


def test_the_storage_check_never_writes_through_a_planted_link(tmp_path: Path) -> None:
    """Links at every path the old storage check opened as root (``.relaunch-check-<host>-
    <pid>``) towards a file the user could not write: nothing is written through them, and
    the check's own folder is gone afterwards."""
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    scratch.chmod(0o777)
    victim = tmp_path / "victim"
    victim.write_text("untouched\n")
    host = socket.gethostname()
    pid_max = int(Path("/proc/sys/kernel/pid_max").read_text())
    last = int(Path("/proc/sys/kernel/ns_last_pid").read_text())
    for pid in range(1, pid_max + 1) if pid_max <= 65536 else range(last, last + 30000):
        os.symlink(victim, scratch / f".relaunch-check-{host}-{pid}")
    planted = len(os.listdir(scratch))
    check = next(c for c in builtin_checks() if c.id == "storage-rw")
    done = subprocess.run(
        wrapped_argv(check, "n1"),
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin", "RELAUNCH_CHECK_DIR": str(scratch)},
    )
    result = judge(check, done.returncode, done.stdout + done.stderr)
    assert result.passed, result
    assert victim.read_text() == "untouched\n"
    assert len(os.listdir(scratch)) == planted  # no link removed, no folder left behind


# ------------------------------------------------------------------ the activity


class Maintenance:
    """What `lifecycle_checks` asks of Slurm: the jobs on the node (one answer per read, the
    last repeated), and the check steps (their output, census included)."""

    def __init__(self, answers: list[list[NodeJob]], output: str = "ok\n", code: int = 0):
        self.answers, self.reads, self.output, self.code = answers, 0, output, code
        self.steps: list[str] = []

    async def jobs_on_node(self, node: str) -> list[NodeJob]:
        self.reads += 1
        return self.answers[min(self.reads - 1, len(self.answers) - 1)]

    async def run_on_node(
        self, node: str, argv: Sequence[str], *, job_name: str, **_: Any
    ) -> tuple[int | None, str, float]:
        self.steps.append(job_name)
        return self.code, self.output, 0.1


class Audit:
    def __init__(self) -> None:
        self.rows: list[Any] = []

    async def record(self, record: Any, *, dedupe_key: str | None = None) -> bool:
        self.rows.append(record)
        return True

    async def events(self, incident_id: str) -> list[Any]:  # no pause (relaunch pause)
        return []


class Activities(LifecycleActivities):
    def __init__(self, deps: Deps, maint: Maintenance) -> None:
        super().__init__(deps)
        self.maint = maint

    def _maintenance(self) -> Any:
        return self.maint


async def checks(
    maint: Maintenance, monkeypatch: pytest.MonkeyPatch, wait_s: float = 5.0, census: bool = True
) -> tuple[CheckRun, Audit, FakeScheduler]:
    monkeypatch.setattr(lifecycle_activities, "CLEAR_POLL_S", 0.01, raising=False)
    sched = FakeScheduler()
    sched.set_node("n1", state=NodeState.MIXED, flags=["DRAIN"], reason="relaunch incident x")
    config = ClusterConfig(name="c", database_url="postgresql://x", bundle_dir="/tmp")
    audit = Audit()
    deps = Deps(config=config, scheduler=sched, audit=audit)  # type: ignore[arg-type]
    site = HealthCheck(id="site", argv=["true"], pass_pattern="^ok$")
    settings = LifecycleSettings(
        checks=[site],
        skip_checks=[c.id for c in builtin_checks()],
        drain_wait_s=wait_s,
        census=census,
    )
    inp = ChecksInput(
        lifecycle_id="relaunch-c-lifecycle-n1-1", cluster="c", node="n1", settings=settings,
        purpose="diagnose", category=Category.GPU_HARDWARE, since=NOW,
    )  # fmt: skip
    got = await ActivityEnvironment().run(Activities(deps, maint).run_checks, inp)
    return got, audit, sched


async def test_the_checks_wait_for_a_users_job_and_start_once_it_has_left(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    maint = Maintenance([[job("8", 1001)], [job("8", 1001, JobState.COMPLETING)], []])
    run, audit, sched = await checks(maint, monkeypatch)
    assert run.passed and maint.steps == ["relaunch-check-site"]
    assert maint.reads >= 3  # no step before the node was clear
    kinds = [r.kind for r in audit.rows]
    assert kinds == ["checks_wait", "checks_waited"]
    assert "still runs job 8 (uid 1001, RUNNING)" in audit.rows[0].summary
    assert "clear after" in audit.rows[1].summary
    assert sched.resumes == ["n1"]  # the drain cleared only once the node was clear


async def test_a_job_that_never_leaves_gives_an_inconclusive_run_and_no_step(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    maint = Maintenance([[job("8", 1001)]])
    run, audit, sched = await checks(maint, monkeypatch, wait_s=0.05)
    assert not run.passed and maint.steps == [] and run.results == []
    assert "job 8 (uid 1001, RUNNING) still on n1" in run.inconclusive
    assert sched.resumes == [] and "no check started" in audit.rows[-1].summary


async def test_a_failed_check_beside_a_users_process_is_inconclusive(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    out = "relaunch-census: 0 1001\nboom\nrelaunch-census: 0\n"
    run, _, _ = await checks(Maintenance([[]], output=out, code=1), monkeypatch)
    assert not run.passed and "site failed while processes of uid 1001" in run.inconclusive
    alone, _, _ = await checks(Maintenance([[]], output="boom\n", code=1), monkeypatch)
    assert not alone.passed and alone.inconclusive == ""  # the node's own failure
    # Where the census is off (nodes sharing one machine), a failure is the node's again.
    off, _, _ = await checks(Maintenance([[]], output=out, code=1), monkeypatch, census=False)
    assert not off.passed and off.inconclusive == "" and off.results[0].users == []


# ------------------------------------------------------------------ the workflow


class Busy(Node):
    """Checks that fail beside a user's process: inconclusive every time."""

    @activity.defn(name="lifecycle_checks")
    async def checks(self, inp: ChecksInput) -> CheckRun:
        self.runs += 1
        bad = CheckResult(id="dev-gpu", passed=False, detail="exit 1", users=[1001])
        return CheckRun(
            purpose=inp.purpose, results=[bad], started_at=NOW, finished_at=NOW,
            inconclusive="dev-gpu failed while processes of uid 1001 were on the node",
        )  # fmt: skip


async def test_an_inconclusive_run_goes_to_a_person_never_up_the_ladder(env: Client) -> None:
    node = Busy()
    handle = await run(env, Mode.AUTONOMOUS)
    async with worker(env, node):
        sent = await until(handle, lambda s: s.stage is NodeStage.ESCALATED)
    await replays(env, handle.id, "lifecycle_inconclusive")
    assert node.rungs == [] and sent.tried == [] and node.runs == 1
    assert "the checks were inconclusive: dev-gpu failed" in sent.outcome, sent.outcome
    assert node.holds == ["checks inconclusive"] and len(node.tickets) == 1
    assert node.tickets[0].why.startswith("the checks were inconclusive")
    assert [r.stage for r in node.kinds("stage")] == ["held"]
