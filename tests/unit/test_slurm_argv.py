"""The exact command lines SlurmCli runs, against golden files (submitit's approach), and
the brief squeue text it polls, from a fixture in squeue's own format.

Each operation of the adapter (the reads, drain, fence, resume, requeue with and without
excluded nodes, the batch requeue, hold, release, cancel, resubmit...) runs against a
recording runner that plays a small Slurm cluster in memory (seeded from the recorded fixtures
in tests/fixtures/slurm/), so no Slurm is needed. Every argv the operation issues, in order
(its fresh read, the action, the verifying read), is compared with
``tests/fixtures/slurm/golden/<operation>.json``: one argv per line, as a JSON list. Any
change to a command line fails here, and the diff of the golden file shows it in review.

After a deliberate change, regenerate the files and review their diff::

    RELAUNCH_UPDATE_GOLDEN=1 .venv/bin/python -m pytest -q tests/unit/test_slurm_argv.py

The brief listing's fixture, tests/fixtures/slurm/squeue_brief.txt, and how it is produced are
described in tests/fixtures/slurm/README.md (record.sh records it).
"""

from __future__ import annotations

import copy
import json
import os
import shlex
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from relaunch.connectors.slurm import parse
from relaunch.connectors.slurm.commands import SlurmCli
from relaunch.connectors.slurm.runner import CommandResult
from relaunch.models import hostlist
from relaunch.models.errors import ControllerUnavailableError, InvalidNameError, SchedulerError
from relaunch.models.scheduler import ExitCode, Job, JobState

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "slurm"
GOLDEN = FIXTURES / "golden"
UPDATE = os.environ.get("RELAUNCH_UPDATE_GOLDEN") == "1"


class RecordingSlurm:
    """A CommandRunner that records each argv and answers it like Slurm 22.05 would, from a
    small cluster held as squeue/sinfo JSON: the jobs of squeue_running.json, the nodes of
    sinfo_idle_drained.json (n1 and n4 drained). Actions change that state, so an action's
    verifying read sees it done.

    ``scontrol requeue`` takes a list of jobs and answers as Slurm 22.05 does (seen on the real
    one): it requeues every job it can, prints ``<error> for job <id>`` on stderr for each one it
    cannot, and exits 1 if there was any. ``refuse`` names jobs it refuses anyway (with why),
    ``unseen`` jobs whose requeue it accepts but that never show it."""

    def __init__(self) -> None:
        self.argvs: list[list[str]] = []
        jobs = json.loads((FIXTURES / "squeue_running.json").read_text())["jobs"]
        nodes = json.loads((FIXTURES / "sinfo_idle_drained.json").read_text())["nodes"]
        self.jobs: dict[str, dict[str, Any]] = {str(j["job_id"]): copy.deepcopy(j) for j in jobs}
        self.nodes: dict[str, dict[str, Any]] = {n["name"]: copy.deepcopy(n) for n in nodes}
        self.json_errors: list[dict[str, Any]] = []
        self.refuse: dict[str, str] = {}
        self.unseen: set[str] = set()

    async def run(
        self, argv: Sequence[str], *, stdin: str | None = None, timeout: float = 30.0
    ) -> CommandResult:
        self.argvs.append(list(argv))
        try:
            out = self._answer(list(argv))
        except KeyError as exc:
            return CommandResult(tuple(argv), 1, "", f"Invalid job id or node {exc}", 0.0)
        except Refused as exc:
            return CommandResult(tuple(argv), 1, "", str(exc), 0.0)
        return CommandResult(tuple(argv), 0, out, "", 0.0)

    def _answer(self, argv: list[str]) -> str:
        match argv:
            case ["squeue", "--json", "--states=all"]:
                return json.dumps({"errors": self.json_errors, "jobs": list(self.jobs.values())})
            case ["sinfo", "--json"]:
                return json.dumps({"errors": self.json_errors, "nodes": list(self.nodes.values())})
            case ["env", "SLURM_TIME_FORMAT=%s", "squeue", *_]:
                return "".join(_brief_line(job) + "\n" for job in self.jobs.values())
            case ["squeue", "--states=all", "--noheader", jobs, _] if jobs.startswith("--jobs="):
                job = self.jobs[jobs.partition("=")[2]]
                fields = (job["job_id"], job["standard_output"], job["standard_error"])
                return "".join(f"{v}\x1f" for v in (*fields, job["job_id"])) + "\n"
            case ["scontrol", "ping"]:
                return "Slurmctld(primary) at ctl is UP\n"
            case ["scontrol", "write", "batch_script", job_id, "-"]:
                return f"#!/bin/bash\n# job {self.jobs[job_id]['job_id']}\nsrun train.py\n"
            case ["scontrol", "update", node, state, *reason] if node.startswith("NodeName="):
                self._update_node(node.partition("=")[2], state.partition("=")[2], reason)
            case ["scontrol", "update", job, excluded] if job.startswith("JobId="):
                self.jobs[job.partition("=")[2]]["excluded_nodes"] = excluded.partition("=")[2]
            case ["scontrol", "requeue" | "requeuehold" as verb, job_list]:
                self._requeue(job_list.split(","), hold=verb == "requeuehold")
            case ["scontrol", "hold" | "release" as verb, job_id]:
                self.jobs[job_id]["state_reason"] = "JobHeldAdmin" if verb == "hold" else "None"
            case ["scancel", job_id]:
                self.jobs[job_id]["job_state"] = "CANCELLED"
            case ["sbatch", "--parsable", *options]:
                return self._submit(options)
            case _:
                raise AssertionError(f"the recording runner does not know {shlex.join(argv)}")
        return ""

    def _requeue(self, job_ids: list[str], *, hold: bool) -> None:
        errors = []
        for job_id in job_ids:
            job = self.jobs.get(job_id)
            if job_id in self.refuse:
                errors.append(f"{self.refuse[job_id]} for job {job_id}")
            elif job is None:
                errors.append(f"Invalid job id specified for job {job_id}")
            elif job["job_state"] == "PENDING":
                errors.append(f"Job is pending execution for job {job_id}")
            elif not job["requeue"]:
                errors.append(f"Requested operation is presently disabled for job {job_id}")
            elif job_id not in self.unseen:
                job.update(job_state="PENDING", nodes="", batch_host="")
                job["state_reason"] = "JobHeldAdmin" if hold else "BeginTime"
                job["restart_cnt"] += 1
        if errors:
            raise Refused("".join(f"{error}\n" for error in errors))

    def _update_node(self, name: str, state: str, reason: list[str]) -> None:
        node = self.nodes[name]
        if state == "DRAIN":
            node["state_flags"] = ["DRAIN", *node["state_flags"]]
            node["reason"] = reason[0].partition("=")[2]
        elif state == "DOWN":
            node["state"] = "down"
            node["reason"] = reason[0].partition("=")[2]
        elif state == "RESUME":
            node.update(state="idle", state_flags=[], reason="")

    def _submit(self, options: list[str]) -> str:
        new_id = max(int(j) for j in self.jobs) + 1
        values = dict(o.removeprefix("--").partition("=")[::2] for o in options)
        job = {
            **copy.deepcopy(self.jobs["2"]),
            "job_id": new_id,
            "job_state": "PENDING",
            "state_reason": "None",
            "comment": values.get("comment", ""),
            "excluded_nodes": values.get("exclude", ""),
        }
        self.jobs[str(new_id)] = job
        return f"{new_id}\n"


class Refused(Exception):
    """Slurm's stderr for a command it refused (in part)."""


def _brief_line(job: dict[str, Any]) -> str:
    """One job as ``squeue --Format=<parse.BRIEF_FORMAT>`` prints it (see squeue_brief.txt)."""
    array_job, task = job.get("array_job_id") or 0, job.get("array_task_id")
    values = {
        "JobID": str(job["job_id"]),
        "ArrayJobID": str(array_job or job["job_id"]),
        "ArrayTaskID": "N/A" if task is None else str(task),
        "Name": job["name"],
        "UserName": job["user_name"],
        "State": job["job_state"],
        "Reason": job["state_reason"],
        "exit_code": str(job["exit_code"]),
        "Partition": job["partition"],
        "NodeList": job["nodes"],
        "NumNodes": str(len(hostlist.expand(job["nodes"])) or job["node_count"]),
        "BatchHost": job["batch_host"],
        "RestartCnt": str(job["restart_cnt"]),
        "Requeue": "1" if job["requeue"] else "0",
        "Comment": job["comment"] or "(null)",
        "STDOUT": job["standard_output"],
        "STDERR": job["standard_error"],
        "WorkDir": job["current_working_directory"],
        "Command": job["command"] or "(null)",
        "NumTasks": str(job["tasks"] or 1),
        "TimeLimit": "UNLIMITED",
        "SubmitTime": str(job["submit_time"]),
        "EligibleTime": str(job["eligible_time"] or "N/A"),
        "StartTime": str(job["start_time"] or "N/A"),
        "EndTime": str(job["end_time"] or "N/A"),
        "UserID": str(job["user_id"]),
        "GroupID": str(job["group_id"]),
    }
    assert list(values) == list(parse.BRIEF_FIELDS)
    closed = [*values.values(), values[parse.BRIEF_CLOSE]]
    return "".join(v + parse.BRIEF_SEPARATOR for v in closed)


# ---------------------------------------------------------------- the operations

Operation = Callable[[SlurmCli, RecordingSlurm], Awaitable[object]]


async def _requeue_excluding(slurm: SlurmCli, cluster: RecordingSlurm) -> None:
    # What the restart activity does: requeue, then exclude the culprits while pending.
    await slurm.requeue_job("1", expected_restart_count=0)
    await slurm.exclude_nodes("1", ["n1", "n3"])


async def _hold(slurm: SlurmCli, cluster: RecordingSlurm) -> None:
    await slurm.requeue_job("1")  # only a pending job can be held
    cluster.argvs.clear()
    await slurm.hold_job("1")


async def _read_with_json_errors(slurm: SlurmCli, cluster: RecordingSlurm) -> None:
    # squeue/sinfo exit 0 with errors inside the JSON; scontrol ping tells a dead controller.
    cluster.json_errors = [{"error": "Unable to contact slurm controller", "error_number": 1}]
    with pytest.raises(SchedulerError, match="squeue reported: Unable to contact"):
        await slurm.list_jobs()


async def _requeue_jobs(slurm: SlurmCli, cluster: RecordingSlurm) -> None:
    # A rack's jobs: two running, one finished, one pending, one that may not be requeued, one
    # Slurm no longer knows, one it refuses when asked: one read, one command, one verification.
    cluster.jobs["4"]["requeue"] = False
    cluster.refuse["1"] = "Requested operation is presently disabled"
    asked = {"5": 0, "2": 0, "3": 0, "4": 0, "999": 0, "1": 0}
    results = await slurm.requeue_jobs(asked)
    assert list(results) == list(asked)
    assert {j: (r.changed, r.note) for j, r in results.items()} == {
        "5": (True, ""),
        "2": (True, ""),
        "3": (False, "already pending"),
        "4": (False, "does not allow requeue"),
        "999": (False, "not found"),
        "1": (
            False,
            "not requeued: Requested operation is presently disabled (last read: RUNNING "
            "nodes=n1,n2 restarts=0 reason=-)",
        ),
    }
    assert results["5"].after.startswith("PENDING") and "restarts=1" in results["5"].after
    assert all(r.action == "requeue" and r.target == j for j, r in results.items())


async def _requeue_jobs_retried(slurm: SlurmCli, cluster: RecordingSlurm) -> None:
    # A retried batch (same expected counts) reads the queue and requeues nothing again.
    await slurm.requeue_jobs({"1": 0, "5": 0})
    cluster.argvs.clear()
    results = await slurm.requeue_jobs({"1": 0, "5": 0})
    assert [(r.changed, r.note) for r in results.values()] == [(False, "already requeued")] * 2


async def _requeue_jobs_in_chunks(slurm: SlurmCli, cluster: RecordingSlurm) -> None:
    # 250 running jobs: two scontrol commands (200 ids, then 50), one read before and after.
    for n in range(100, 350):
        cluster.jobs[str(n)] = {**copy.deepcopy(cluster.jobs["5"]), "job_id": n}
    results = await slurm.requeue_jobs({str(n): 0 for n in range(100, 350)})
    assert len(results) == 250 and all(r.changed for r in results.values())
    sent = [argv[2].split(",") for argv in cluster.argvs if argv[:2] == ["scontrol", "requeue"]]
    assert [len(ids) for ids in sent] == [200, 50] and sent[0][0] == "100" and sent[1][0] == "300"


OPERATIONS: dict[str, Operation] = {
    "read_jobs": lambda s, c: s.list_jobs(),
    "read_jobs_brief": lambda s, c: s.list_jobs_brief(),
    "read_job_brief": lambda s, c: s.get_job_brief("5"),
    "read_nodes": lambda s, c: s.list_nodes(),
    "read_batch_script": lambda s, c: s.batch_script("1"),
    "read_with_json_errors": _read_with_json_errors,
    "drain": lambda s, c: s.drain_node("n2", "relaunch incident relaunch-dev-1-0"),
    "drain_already_drained": lambda s, c: s.drain_node("n1", "relaunch incident x"),
    "fence": lambda s, c: s.fence_node("n3", "relaunch incident relaunch-dev-1-0 (no slurmd)"),
    "resume": lambda s, c: s.resume_node("n4"),
    "requeue": lambda s, c: s.requeue_job("1", expected_restart_count=0),
    "requeue_excluding_nodes": _requeue_excluding,
    "requeue_hold": lambda s, c: s.requeue_job("1", hold=True),
    "requeue_jobs": _requeue_jobs,
    "requeue_jobs_retried": _requeue_jobs_retried,
    "requeue_jobs_in_chunks": _requeue_jobs_in_chunks,
    "hold": _hold,
    "release": lambda s, c: s.release_job("3"),
    "cancel": lambda s, c: s.cancel_job("5"),
    "submit": lambda s, c: s.resubmit_job("2"),
    "submit_excluding_nodes": lambda s, c: s.resubmit_job("2", exclude=["n1", "n3"]),
}


async def _record(name: str) -> list[list[str]]:
    cluster = RecordingSlurm()
    # As root (the dev stack's account): resubmissions carry --uid/--gid, as in production.
    slurm = SlurmCli(runner=cluster, submit_as="root", verify_timeout=1.0)
    await OPERATIONS[name](slurm, cluster)
    return cluster.argvs


def _render(argvs: list[list[str]]) -> str:
    """One argv per line, so that a changed argument shows as a one-line diff."""
    lines = ",\n".join("  " + json.dumps(argv) for argv in argvs)
    return f"[\n{lines}\n]\n"


@pytest.mark.parametrize("name", sorted(OPERATIONS))
async def test_the_argv_matches_its_golden_file(name: str) -> None:
    argvs = await _record(name)
    path = GOLDEN / f"{name}.json"
    if UPDATE:
        GOLDEN.mkdir(parents=True, exist_ok=True)
        path.write_text(_render(argvs))
    assert path.exists(), f"no golden file {path.name}: run with RELAUNCH_UPDATE_GOLDEN=1"
    assert argvs == json.loads(path.read_text()), (
        f"SlurmCli's commands for {name!r} changed; if on purpose, regenerate with "
        "RELAUNCH_UPDATE_GOLDEN=1 and review the diff of " + str(path.relative_to(FIXTURES))
    )


def test_every_golden_file_belongs_to_an_operation() -> None:
    """A golden file whose operation was removed is stale, and would be reviewed for nothing."""
    assert sorted(p.stem for p in GOLDEN.glob("*.json")) == sorted(OPERATIONS)


# ---------------------------------------------------------------- the batch requeue's failures


async def test_a_job_never_seen_requeued_does_not_hide_the_others() -> None:
    cluster = RecordingSlurm()
    cluster.unseen.add("1")  # Slurm accepts its requeue, but its restart count never goes up
    slurm = SlurmCli(runner=cluster, verify_timeout=0.3)
    results = await slurm.requeue_jobs({"1": 0, "5": 0})
    assert results["5"].changed and not results["1"].changed
    assert results["1"].note.startswith("not requeued: no restart seen within 0.3s (last read: ")
    assert "RUNNING" in results["1"].note


async def test_a_bad_id_in_a_batch_stops_it_before_anything_runs() -> None:
    cluster = RecordingSlurm()
    slurm = SlurmCli(runner=cluster)
    with pytest.raises(InvalidNameError):
        await slurm.requeue_jobs({"1": 0, "1; scancel -u root": 0})
    assert cluster.argvs == []
    assert await slurm.requeue_jobs({}) == {} and cluster.argvs == []


async def test_a_batch_requeue_raises_when_the_controller_does_not_answer() -> None:
    class Down(RecordingSlurm):
        async def run(
            self, argv: Sequence[str], *, stdin: str | None = None, timeout: float = 30.0
        ) -> CommandResult:
            if argv[:2] == ["scontrol", "requeue"]:
                self.argvs.append(list(argv))
                error = "scontrol: error: Unable to contact slurm controller (connect failure)"
                return CommandResult(tuple(argv), 1, "", error + "\n", 0.0)
            return await super().run(argv, stdin=stdin, timeout=timeout)

    slurm = SlurmCli(runner=Down())
    with pytest.raises(ControllerUnavailableError):
        await slurm.requeue_jobs({"1": 0, "5": 0})


# ---------------------------------------------------------------- the brief listing's text


def brief_jobs() -> dict[str, Job]:
    jobs = parse.jobs_from_brief((FIXTURES / "squeue_brief.txt").read_text())
    assert jobs is not None, "squeue_brief.txt does not parse: the listing would be refused"
    return {job.job_id: job for job in jobs}


def test_the_brief_listing_lists_every_job_squeue_printed() -> None:
    assert list(brief_jobs()) == [
        "3", "4", "8", "7", "9", "15", "10", "11", "12", "13", "17", "23", "18", "19", "20",
        "21", "22", "14", "6", "5", "16", "24", "29", "30", "25", "26", "27", "31", "28",
    ]  # fmt: skip


def test_a_running_multi_node_job_from_the_brief_listing() -> None:
    job = brief_jobs()["27"]
    assert (job.name, job.state, job.reason) == ("train", JobState.RUNNING, "")  # "None"
    assert job.nodes == ["n1", "n2"] and job.node_count == 2 and job.batch_host == "n1"
    assert job.comment_fields == {"relaunch": "on", "max_restarts": "2"}
    assert job.requeue_allowed and job.restart_count == 0 and job.num_tasks == 2
    assert job.stdout_path == "/tmp/tmp.P4JwHdcvZJ/train-27.out"  # %j expanded
    assert job.time_limit_minutes is None  # squeue's UNLIMITED
    assert job.start_time == datetime(2026, 12, 3, 11, 58, 54, tzinfo=UTC)
    assert (job.user, job.user_id, job.group_id) == ("root", 0, 0)
    assert job.excluded_nodes == []  # the brief listing has none (actions read the JSON)


def test_pending_and_held_jobs_from_the_brief_listing() -> None:
    jobs = brief_jobs()
    wide, held = jobs["29"], jobs["30"]
    assert (wide.state, wide.reason, wide.held) == (JobState.PENDING, "Resources", False)
    assert wide.nodes == [] and wide.node_count == 4 and wide.batch_host == ""  # squeue's n/a
    assert wide.end_time is None  # squeue's N/A (its start time is Slurm's estimate)
    assert (held.state, held.reason, held.held) == (JobState.PENDING, "JobHeldUser", True)
    assert held.start_time is None and held.comment == "" and held.command == ""  # (null)


def test_array_tasks_and_heterogeneous_components_are_jobs_of_their_own() -> None:
    jobs = brief_jobs()
    # Array 28: each task has its own job id (task 1 is job 31, the last task keeps 28).
    assert [(jobs[i].nodes, jobs[i].stdout_path.rsplit("/", 1)[1]) for i in ("31", "28")] == [
        (["n3"], "arr-28_1.out"),
        (["n4"], "arr-28_2.out"),
    ]
    # Heterogeneous job 25: its second component is job 26, on a hostlist with a gap.
    assert jobs["25"].nodes == ["n2"]
    assert jobs["26"].nodes == ["n1", "n3", "n4"] and jobs["26"].node_count == 3


def test_finished_jobs_from_the_brief_listing() -> None:
    jobs = brief_jobs()
    failed = jobs["24"]
    assert (failed.state, failed.reason) == (JobState.FAILED, "NonZeroExitCode")
    assert failed.exit_code == ExitCode(code=3)  # squeue prints the raw wait status, 768
    assert failed.state.is_abnormal_end and failed.nodes == ["n1"]
    assert jobs["9"].exit_code == ExitCode(signal=15)  # cancelled while running: SIGTERM
    # Requeued once, then cancelled while pending again: no nodes.
    assert (jobs["4"].state, jobs["4"].restart_count, jobs["4"].nodes) == (
        JobState.CANCELLED,
        1,
        [],
    )
    # The demo's job: requeued by Relaunch, then cancelled on its new nodes.
    assert (jobs["3"].name, jobs["3"].restart_count, jobs["3"].nodes) == (
        "train-ddp",
        1,
        ["n3", "n4"],
    )


async def test_the_adapter_reads_the_brief_listing_without_falling_back() -> None:
    class Squeue:
        def __init__(self) -> None:
            self.argvs: list[tuple[str, ...]] = []

        async def run(
            self, argv: Sequence[str], *, stdin: str | None = None, timeout: float = 30.0
        ) -> CommandResult:
            self.argvs.append(tuple(argv))
            text = (FIXTURES / "squeue_brief.txt").read_text()
            return CommandResult(tuple(argv), 0, text, "", 0.0)

    runner = Squeue()
    slurm = SlurmCli(runner=runner)
    assert [j.job_id for j in await slurm.list_jobs_brief()] == list(brief_jobs())
    assert (await slurm.get_job_brief("26")).nodes == ["n1", "n3", "n4"]
    assert all("--json" not in argv for argv in runner.argvs)
