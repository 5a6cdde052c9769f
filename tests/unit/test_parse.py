"""The parsers over recorded Slurm 22.05 output (tests/fixtures/slurm, see record.sh there) and
over the documented shapes of newer slurmrestd/squeue versions."""

from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from relaunch.connectors.slurm import parse
from relaunch.connectors.slurm.commands import SlurmCli
from relaunch.connectors.slurm.runner import CommandResult
from relaunch.models import names
from relaunch.models.errors import JobNotFoundError, SchedulerError
from relaunch.models.scheduler import ExitCode, Job, JobState, Node, NodeState

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "slurm"
JOB_FIXTURES = ["squeue_running", "squeue_requeued", "squeue_finished", "rest_jobs"]
NODE_FIXTURES = ["sinfo_drain", "sinfo_idle_drained", "rest_nodes"]
OUT_DIR = "/tmp/tmp.Bnn9VVdLgi"  # the recording's scratch directory, kept in the fixtures
WORK_DIR = "/work/main"  # where record.sh ran


def jobs(fixture: str) -> dict[str, Job]:
    parsed = parse.jobs_from_json((FIXTURES / f"{fixture}.json").read_text())
    return {job.job_id: job for job in parsed}


def nodes(fixture: str) -> dict[str, Node]:
    parsed = parse.nodes_from_json((FIXTURES / f"{fixture}.json").read_text())
    return {node.name: node for node in parsed}


# ------------------------------------------------------------------ every fixture


@pytest.mark.parametrize("fixture", JOB_FIXTURES)
def test_every_job_fixture_parses_into_safe_ids_and_names(fixture: str) -> None:
    parsed = jobs(fixture)
    assert sorted(parsed) == ["1", "2", "3", "4", "5"]
    for job in parsed.values():
        assert names.job_id(job.job_id) == job.job_id
        assert job.user == "root"
        assert job.partition == "debug"
        assert job.work_dir == WORK_DIR
        assert job.state is not JobState.UNKNOWN
        assert all(names.node_name(n) for n in [*job.nodes, *job.excluded_nodes])


@pytest.mark.parametrize("fixture", NODE_FIXTURES)
def test_every_node_fixture_parses(fixture: str) -> None:
    parsed = nodes(fixture)
    assert sorted(parsed) == ["n1", "n2", "n3", "n4"]
    for node in parsed.values():
        assert node.state is not NodeState.UNKNOWN
        assert node.cpus == 2
        assert node.partitions == ["debug"]


def test_sbatch_parsable_fixture() -> None:
    text = (FIXTURES / "sbatch_parsable.txt").read_text()
    assert text.endswith("\n")
    assert parse.sbatch_job_id(text) == text.strip()
    assert names.job_id(text.strip())


# ------------------------------------------------------------------ jobs


def test_running_jobs() -> None:
    parsed = jobs("squeue_running")
    train = parsed["1"]
    assert train.name == "train"
    assert train.state is JobState.RUNNING
    assert train.reason == ""  # Slurm's "None" is no reason
    assert train.nodes == ["n1", "n2"]
    assert train.node_count == 2
    assert train.num_tasks == 2
    assert train.batch_host == "n1"
    assert train.excluded_nodes == []
    assert train.restart_count == 0
    assert train.requeue_allowed is True
    assert train.time_limit_minutes == 525600
    assert train.comment_fields == {"relaunch": "on", "max_restarts": "2"}
    assert train.held is False
    assert train.start_time is not None and train.start_time.tzinfo is UTC
    assert parsed["3"].state is JobState.PENDING
    assert parsed["3"].nodes == []
    assert parsed["3"].comment_fields == {}


def test_failed_job_exit_code_and_reason() -> None:
    failed = jobs("squeue_running")["2"]
    assert failed.state is JobState.FAILED
    assert failed.state.is_abnormal_end
    assert failed.reason == "NonZeroExitCode"
    assert failed.exit_code == ExitCode(code=3, signal=0)
    assert str(failed.exit_code) == "3:0"
    assert failed.nodes == ["n1"]


def test_held_job() -> None:
    held = jobs("squeue_running")["3"]
    assert held.reason == "JobHeldUser"
    assert held.held is True
    # Once cancelled it keeps the reason but is no longer held.
    assert jobs("squeue_finished")["3"].held is False


def test_requeued_job_excludes_node_and_counts_restart() -> None:
    train = jobs("squeue_requeued")["1"]
    assert train.state is JobState.PENDING
    assert train.state.is_active
    assert train.reason == "BeginTime"
    assert train.excluded_nodes == ["n1"]
    assert train.restart_count == 1
    assert train.nodes == []
    assert train.comment_fields == {"relaunch": "on", "max_restarts": "2"}


def test_finished_jobs() -> None:
    parsed = jobs("squeue_finished")
    assert {job.state for job in parsed.values()} == {JobState.CANCELLED, JobState.FAILED}
    assert parsed["1"].excluded_nodes == ["n1"]
    assert parsed["1"].restart_count == 1
    assert parsed["2"].exit_code == ExitCode(code=3, signal=0)
    # The array tasks were killed by scancel: SIGTERM, no return code.
    for task in ("4", "5"):
        assert parsed[task].state is JobState.CANCELLED
        assert str(parsed[task].exit_code) == "0:15"
        assert parsed[task].state.is_terminal


def test_array_tasks_run_on_their_own_nodes() -> None:
    parsed = jobs("squeue_running")
    assert (parsed["5"].nodes, parsed["4"].nodes) == (["n2"], ["n3"])


@pytest.mark.parametrize(
    ("job_id", "pattern", "path"),
    [
        ("1", f"{OUT_DIR}/train-%j.out", f"{OUT_DIR}/train-1.out"),
        ("2", f"{OUT_DIR}/fail-%x-%j.out", f"{OUT_DIR}/fail-failing-2.out"),
        ("5", f"{OUT_DIR}/arr-%A_%a.out", f"{OUT_DIR}/arr-4_1.out"),  # array task 4_1
        ("4", f"{OUT_DIR}/arr-%A_%a.out", f"{OUT_DIR}/arr-4_2.out"),  # array task 4_2
        ("3", "slurm-%j.out", f"{WORK_DIR}/slurm-3.out"),  # no -o: Slurm's default
    ],
)
@pytest.mark.parametrize("fixture", JOB_FIXTURES)
def test_output_paths_are_resolved(fixture: str, job_id: str, pattern: str, path: str) -> None:
    job = jobs(fixture)[job_id]
    assert job.stdout_pattern == pattern
    assert job.stdout_path == path
    # No -e given: stderr goes to the same file as stdout.
    assert job.stderr_path == path


def test_output_pattern_codes() -> None:
    job = Job(job_id="7", name="x", user="alice", nodes=["n3"], work_dir="/home/alice")
    assert parse.expand_output_pattern("%u/%x-%5j-%N.%%.out", job) == (
        "/home/alice/alice/x-00007-n3.%.out"
    )
    assert parse.expand_output_pattern("/abs/%j", job) == "/abs/7"


# ------------------------------------------------------------------ nodes


def test_drained_nodes_while_a_job_still_runs() -> None:
    parsed = nodes("sinfo_drain")
    n1, n4 = parsed["n1"], parsed["n4"]
    # n1 still runs part of job 1: draining, not drained.
    assert (n1.state, n1.flags, n1.display_state) == (NodeState.MIXED, ["DRAIN"], "MIXED+DRAIN")
    assert n1.drain_flag is True
    assert n1.drained is False
    assert n1.reason == "relaunch incident 42"
    assert n1.reason_user == "root"
    assert n1.reason_time == datetime.fromtimestamp(1796215054, tz=UTC)
    # n4 was idle when drained: drained at once.
    assert n4.display_state == "IDLE+DRAIN"
    assert (n4.drain_flag, n4.drained) == (True, True)
    assert n4.reason == "relaunch test drain"
    # Untouched nodes.
    assert parsed["n2"].display_state == "ALLOCATED"
    assert parsed["n3"].display_state == "MIXED"
    for name in ("n2", "n3"):
        assert parsed[name].drain_flag is False
        assert (parsed[name].reason, parsed[name].reason_user) == ("", "")
        assert parsed[name].reason_time is None


def test_nodes_once_jobs_are_gone() -> None:
    parsed = nodes("sinfo_idle_drained")
    assert parsed["n1"].display_state == "IDLE+DRAIN"
    assert parsed["n1"].drained is True
    assert parsed["n1"].reason == "relaunch incident 42"
    assert parsed["n2"].display_state == "IDLE"
    assert parsed["n2"].drained is False


def test_duplicate_node_entries_are_merged() -> None:
    # sinfo may list a node once per partition.
    text = '{"nodes": [{"name": "n1", "state": "idle"}, {"name": "n1", "state": "idle"}]}'
    assert [node.name for node in parse.nodes_from_json(text)] == ["n1"]


# ------------------------------------------------------------------ REST parity


def test_rest_jobs_match_squeue_recorded_at_the_same_moment() -> None:
    rest = [job.model_dump() for job in jobs("rest_jobs").values()]
    cli = [job.model_dump() for job in jobs("squeue_running").values()]
    assert rest == cli


def test_rest_nodes_match_sinfo_recorded_at_the_same_moment() -> None:
    rest = [node.model_dump() for node in nodes("rest_nodes").values()]
    cli = [node.model_dump() for node in nodes("sinfo_drain").values()]
    assert rest == cli


# ------------------------------------------------------------------ newer API shapes
# Hand-written, following the documented Slurm 23.11+/24.x OpenAPI shapes (data_parser
# v0.0.40 and later): job_state and node state are lists of flags, exit_code is an object,
# numbers and times are {"set", "infinite", "number"} objects. Not recorded output.


def _num(n: int, *, set_: bool = True, infinite: bool = False) -> dict[str, Any]:
    return {"set": set_, "infinite": infinite, "number": n}


NEW_JOB: dict[str, Any] = {
    "job_id": 42,
    "name": "train",
    "user_name": "alice",
    "job_state": ["PENDING", "REQUEUED"],
    "state_reason": "BeginTime",
    "exit_code": {
        "status": ["EXITED"],
        "return_code": {"set": True, "infinite": False, "number": 1},
        "signal": {"id": {"set": False, "infinite": False, "number": 0}, "name": ""},
    },
    "partition": "gpu",
    "nodes": "",
    "node_count": _num(2),
    "excluded_nodes": "gpu-a[01-02]",
    "batch_host": "",
    "restart_cnt": 1,
    "requeue": True,
    "comment": "relaunch=on",
    "standard_output": "logs/%x-%j.out",
    "standard_error": "",
    "current_working_directory": "/home/alice",
    "command": "/home/alice/train.sh",
    "tasks": _num(16),
    "time_limit": _num(120),
    "array_job_id": _num(0),
    "array_task_id": _num(0, set_=False),
    "submit_time": _num(1_700_000_000),
    "eligible_time": _num(1_700_000_100),
    "start_time": _num(0),
    "end_time": _num(0),
}

NEW_NODE: dict[str, Any] = {
    "name": "gpu-a01",
    "state": ["IDLE", "DRAIN"],
    "reason": "xid 79",
    "reason_set_by_user": "root",
    "reason_changed_at": _num(1_700_000_200),
    "partitions": ["gpu"],
    "cpus": 64,
    "alloc_cpus": 0,
}


def test_newer_job_shape() -> None:
    job = parse.job_from_json(NEW_JOB)
    assert job.job_id == "42"
    assert job.state is JobState.PENDING
    assert job.reason == "BeginTime"
    assert job.exit_code == ExitCode(code=1, signal=0)
    assert job.excluded_nodes == ["gpu-a01", "gpu-a02"]
    assert job.restart_count == 1
    assert (job.node_count, job.num_tasks, job.time_limit_minutes) == (2, 16, 120)
    assert job.submit_time == datetime.fromtimestamp(1_700_000_000, tz=UTC)
    assert job.eligible_time == datetime.fromtimestamp(1_700_000_100, tz=UTC)
    assert job.start_time is None and job.end_time is None
    assert job.stdout_path == "/home/alice/logs/train-42.out"  # not an array job
    assert job.stderr_path == job.stdout_path


def test_newer_job_shape_variants() -> None:
    signalled = {
        **NEW_JOB,
        "job_state": ["CANCELLED"],
        "exit_code": {
            "status": ["SIGNALED"],
            "return_code": _num(0),
            "signal": {"id": _num(9), "name": "KILL"},
        },
        "time_limit": _num(0, infinite=True),
        "array_job_id": _num(40),
        "array_task_id": _num(3),
        "standard_output": "",
    }
    job = parse.job_from_json(signalled)
    assert job.state is JobState.CANCELLED
    assert str(job.exit_code) == "0:9"
    assert job.time_limit_minutes is None  # UNLIMITED
    assert job.stdout_path == "/home/alice/slurm-40_3.out"


def test_newer_node_shape() -> None:
    node = parse.node_from_json(NEW_NODE)
    assert node.state is NodeState.IDLE
    assert node.flags == ["DRAIN"]
    assert node.drained is True
    assert node.reason == "xid 79"
    assert node.reason_user == "root"
    assert node.reason_time == datetime.fromtimestamp(1_700_000_200, tz=UTC)
    mixed = parse.node_from_json({**NEW_NODE, "state": ["MIXED", "DRAIN"], "alloc_cpus": 8})
    assert (mixed.display_state, mixed.drained) == ("MIXED+DRAIN", False)


# ------------------------------------------------------------------ bad input


@pytest.mark.parametrize("text", ["", "squeue: error: Unable to contact slurm controller", "[1]"])
def test_garbage_raises_scheduler_error(text: str) -> None:
    with pytest.raises(SchedulerError):
        parse.jobs_from_json(text)
    with pytest.raises(SchedulerError):
        parse.nodes_from_json(text)


def test_sbatch_output() -> None:
    assert parse.sbatch_job_id("12;cluster\n") == "12"
    with pytest.raises(SchedulerError):
        parse.sbatch_job_id("sbatch: error: Batch job submission failed")


@pytest.mark.parametrize(
    ("text", "state"),
    [
        ("weird", JobState.UNKNOWN),
        ("", JobState.UNKNOWN),
        (None, JobState.UNKNOWN),
        ("CANCELLED by 0", JobState.CANCELLED),
        ("node_fail", JobState.NODE_FAIL),
    ],
)
def test_job_state_parse(text: str | None, state: JobState) -> None:
    assert JobState.parse(text) is state


@pytest.mark.parametrize(
    ("text", "state"),
    [
        ("mix", NodeState.MIXED),
        ("alloc", NodeState.ALLOCATED),
        ("down*", NodeState.DOWN),
        ("idle~", NodeState.IDLE),
        ("MIXED+DRAIN", NodeState.MIXED),
        ("drained", NodeState.IDLE),
        ("weird", NodeState.UNKNOWN),
        (None, NodeState.UNKNOWN),
    ],
)
def test_node_state_parse(text: str | None, state: NodeState) -> None:
    assert NodeState.parse(text) is state


@pytest.mark.parametrize(("text", "code"), [("1:0", "1:0"), ("0:9", "0:9"), ("bad", "0:0")])
def test_exit_code_parse(text: str, code: str) -> None:
    assert str(ExitCode.parse(text)) == code


def brief_line(**values: str) -> str:
    values = dict(values)
    close = values.pop("close", None)
    fields = dict.fromkeys(parse.BRIEF_FIELDS, "")
    fields.update(
        JobID="42", ArrayJobID="42", ArrayTaskID="N/A", State="RUNNING", exit_code="0",
        NumNodes="2", RestartCnt="1", Requeue="1", NumTasks="2", TimeLimit="30:00",
        EndTime="N/A", SubmitTime="1796238546",
    )  # fmt: skip
    fields.update(values)
    closed = [*fields.values(), fields[parse.BRIEF_CLOSE] if close is None else close]
    return "".join(v + parse.BRIEF_SEPARATOR for v in closed)


def test_the_brief_listing_reads_squeues_text_format() -> None:
    (job,) = parse.jobs_from_brief(
        brief_line(NodeList="n[1-2]", exit_code="768", Comment="relaunch=on", STDOUT="o-%j.out")
        + "\n"
    ) or [None]
    assert job is not None
    assert (job.job_id, job.state, job.nodes, job.restart_count) == (
        "42",
        JobState.RUNNING,
        ["n1", "n2"],
        1,
    )
    assert job.exit_code == ExitCode(code=3) and job.requeue_allowed and job.num_tasks == 2
    assert job.time_limit_minutes == 30 and job.end_time is None
    assert job.submit_time == datetime.fromtimestamp(1796238546, tz=UTC)
    assert job.comment_fields == {"relaunch": "on"} and job.stdout_path.endswith("o-42.out")
    assert parse.jobs_from_brief("") == []


@pytest.mark.parametrize(
    "text",
    [
        brief_line(Comment="a" + parse.BRIEF_SEPARATOR + "b"),  # the separator in a comment
        brief_line(Comment="line one\nline two"),  # a newline in a comment
        brief_line(JobID="not-a-number"),
    ],
)
def test_a_brief_listing_that_does_not_parse_is_refused_whole(text: str) -> None:
    assert parse.jobs_from_brief(brief_line() + "\n" + text) is None


@pytest.mark.parametrize(
    ("limit", "minutes"),
    [("UNLIMITED", None), ("30:00", 30), ("1:00:00", 60), ("1-02:03:00", 1563)],
)
def test_time_limits_in_minutes(limit: str, minutes: int | None) -> None:
    assert parse._minutes(limit) == minutes


class ListingRunner:
    """Answers squeue: the text listing as given, the JSON listing from a recorded fixture."""

    def __init__(self, text: str) -> None:
        self.text, self.argvs = text, list[tuple[str, ...]]()

    async def run(
        self, argv: Sequence[str], *, stdin: str | None = None, timeout: float = 30.0
    ) -> CommandResult:
        self.argvs.append(tuple(argv))
        out = (FIXTURES / "squeue_running.json").read_text() if "--json" in argv else self.text
        return CommandResult(tuple(argv), 0, out, "", 0.0)


async def test_the_brief_listing_falls_back_to_json_when_it_does_not_parse() -> None:
    good = ListingRunner(brief_line() + "\n")
    assert [j.job_id for j in await SlurmCli(runner=good).list_jobs_brief()] == ["42"]
    assert len(good.argvs) == 1 and good.argvs[0][:3] == ("env", "SLURM_TIME_FORMAT=%s", "squeue")
    odd = ListingRunner(brief_line(Comment="x\ny") + "\n")
    listed = await SlurmCli(runner=odd).list_jobs_brief()
    assert {j.job_id for j in listed} == set(jobs("squeue_running"))
    assert odd.argvs[-1] == ("squeue", "--json", "--states=all")


async def test_one_job_from_the_brief_listing() -> None:
    """Polls of one job's state read the shared brief listing; an unknown job is an error; a
    listing that does not parse falls back to the JSON read."""
    runner = ListingRunner(brief_line() + "\n" + brief_line(JobID="43", State="PENDING") + "\n")
    slurm = SlurmCli(runner=runner)
    job = await slurm.get_job_brief("43")
    assert (job.job_id, job.state) == ("43", JobState.PENDING)
    with pytest.raises(JobNotFoundError):
        await slurm.get_job_brief("44")
    assert all("--json" not in argv for argv in runner.argvs)
    json_id = next(iter(jobs("squeue_running")))
    odd = ListingRunner(brief_line(Comment="x\ny") + "\n")
    assert (await SlurmCli(runner=odd).get_job_brief(json_id)).job_id == json_id
    assert odd.argvs[-1] == ("squeue", "--json", "--states=all")


def test_a_line_crafted_in_a_comment_never_passes_for_another_job() -> None:
    """A user's comment holding a newline and a whole fake line for job 43 (RUNNING, on n9):
    the listing is refused whole, so no one reads the fake state."""
    fake = brief_line(JobID="43", State="RUNNING", NodeList="n9")
    text = brief_line(Comment="x\n" + fake) + "\n" + brief_line(JobID="43", State="PENDING")
    listing = parse.BriefListing(text + "\n")
    assert not listing.valid and listing.all() is None
    with pytest.raises(ValueError):
        listing.get("43")


@pytest.mark.parametrize("fixture", JOB_FIXTURES)
def test_the_jobs_uid_and_gid_come_from_the_json_listings(fixture: str) -> None:
    # Job output is read with the job's own access, so every listing must carry its uid.
    assert all((j.user_id, j.group_id) == (0, 0) for j in jobs(fixture).values())


def test_the_jobs_uid_and_gid_come_from_the_brief_listing() -> None:
    (job,) = parse.jobs_from_brief(brief_line(UserID="1001", GroupID="1002") + "\n") or [None]
    assert job is not None and (job.user_id, job.group_id) == (1001, 1002)


@pytest.mark.parametrize(
    ("comment", "budget"),
    [
        ("relaunch=on,max_restarts=2", 2),
        ("relaunch=on", None),
        # The job's user writes the comment: what is not a small plain number is no budget,
        # never an exception in the watcher or the evidence step.
        ("relaunch=on,max_restarts=²", None),
        ("relaunch=on,max_restarts=" + "9" * 5000, None),
        ("relaunch=on,max_restarts=-1", None),
    ],
)
def test_a_jobs_own_restart_budget_is_a_small_plain_number(
    comment: str, budget: int | None
) -> None:
    assert Job(job_id="1", comment=comment).max_restarts == budget


def test_output_patterns_come_from_one_whole_row_of_the_job() -> None:
    """A resubmission reuses the job's output patterns as submitted; 24.11's JSON has them
    expanded, so they are read from squeue's text for that job, refused unless the row is whole."""
    us = "\x1f"
    row = f"7{us}/out/run-%j.log{us}(null){us}7{us}\n"
    assert parse.output_patterns(row, "7") == ("/out/run-%j.log", "/out/run-%j.log")
    both = f"7{us}/o-%j{us}/e-%j{us}7{us}\n"
    assert parse.output_patterns(both, "7") == ("/o-%j", "/e-%j")
    # The job's own user split its path with a newline or a separator: nothing is taken.
    assert parse.output_patterns(f"7{us}/o\n8{us}/x{us}/y{us}7{us}\n", "7") is None
    assert parse.output_patterns(f"7{us}/o{us}x{us}/e{us}7{us}\n", "7") is None
    assert parse.output_patterns(f"8{us}/o{us}/e{us}8{us}\n", "7") is None
    assert parse.output_patterns("", "7") is None
