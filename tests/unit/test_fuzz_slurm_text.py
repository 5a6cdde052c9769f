"""Every parser of Slurm's text, fed jobs whose user-chosen fields (name, comment, output paths,
work dir, command) hold separators, newlines, NULs, escapes and 64 KiB values (hypothesis), each
under the time and memory budget of tests/unit/test_fuzz.py: no crash, no traceback, and no row
that Slurm did not write.

The parsers: squeue's brief text listing (``parse.BriefListing``, what the watcher polls, and
``SlurmCli.list_jobs_brief`` / ``get_job_brief`` with their fallback to ``squeue --json``),
the JSON job record (``parse.job_from_json``: the comment's options and the output path
patterns, where the user's text is parsed again), ``scontrol show reservation``
(``parse.reservation_nodes``), sbatch's answer (``parse.sbatch_job_id``) and scontrol's refusals
(``commands._refusals``), and the catch-up's ``sacct --json`` answer (``accounting.ended_jobs``:
JSON quotes a user's text, the same fields are fuzzed there). Relaunch reads no ``sacct`` text
and no ``scontrol show job`` text (both print a comment raw, as squeue does: see
tests/adversarial/test_listing_forgery.py).

The listing is rendered as Slurm 22.05 prints it (measured: every field raw, newline and
separator included; a row ends with the separator and a newline).
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from relaunch.connectors.slurm import accounting, parse
from relaunch.connectors.slurm.commands import SlurmCli, _refusals
from relaunch.connectors.slurm.runner import CommandResult
from relaunch.models.errors import JobNotFoundError, SchedulerError
from relaunch.models.scheduler import Job, JobState
from tests.support.listing_forgery import forging_comment
from tests.unit.test_fuzz import FUZZ, bounded

SEP = parse.BRIEF_SEPARATOR
_CONTROL_CHARS = re.compile(r"[\x00-\x08\x0a-\x1f\x7f-\x9f\u2028\u2029]")
USER_FIELDS = ("Name", "Comment", "STDOUT", "STDERR", "WorkDir", "Command")
# What a user may put in a field: the listing's separators, every line break Python knows,
# NUL, escapes (CSI, OSC, C1), bidi overrides, Slurm's own null words and path patterns.
_PIECES = [
    SEP, "\n", "\r", "\r\n", "\x00", "\x1c", "\x1d", "\x1e", "\x0b", "\x0c", "\x85", "\u2028",
    "\x1b[31m", "\x1b]0;title\x07", "\x9b2J", "\u202e", "(null)", "N/A", "relaunch=on", ",",
    "=", "relaunch_parent=1", "max_restarts=9", "%j", "%x", "%u", "%99999999999j", "%%", "/",
    "../", "0", "42", "99999", "a", "é", "\ufffd", " ", "\t",
]  # fmt: skip
_USER_TEXT = st.one_of(
    st.lists(st.sampled_from(_PIECES), max_size=12).map("".join),
    st.text(max_size=40),
    # 64 KiB values: one piece, repeated.
    st.builds(lambda piece, n: (piece * n)[:65536], st.sampled_from(_PIECES), st.just(65536)),
)


def _values(job_id: int, uid: int, user: dict[str, str]) -> dict[str, str]:
    """One job's fields as squeue prints them."""
    return {
        "JobID": str(job_id),
        "ArrayJobID": str(job_id),
        "ArrayTaskID": "N/A",
        "Name": user["Name"],
        "UserName": f"user{uid}",
        "State": "RUNNING",
        "Reason": "None",
        "exit_code": "0",
        "Partition": "debug",
        "NodeList": "n1",
        "NumNodes": "1",
        "BatchHost": "n1",
        "RestartCnt": "0",
        "Requeue": "1",
        "Comment": user["Comment"],
        "STDOUT": user["STDOUT"],
        "STDERR": user["STDERR"],
        "WorkDir": user["WorkDir"],
        "Command": user["Command"],
        "NumTasks": "1",
        "TimeLimit": "UNLIMITED",
        "SubmitTime": "1796424151",
        "EligibleTime": "1796424151",
        "StartTime": "1796424151",
        "EndTime": "N/A",
        "UserID": str(uid),
        "GroupID": str(uid),
    }


def asked(fmt: str) -> list[str]:
    """The fields a ``--Format`` asks for, in order (``JobID:0<US>,Name:0<US>`` → JobID, Name)."""
    return [item.split(":")[0] for item in fmt.split(SEP + ",")]


def render(rows: Sequence[dict[str, str]], fmt: str | None = None) -> str:
    """The listing as ``squeue --Format=<fmt>`` (the one SlurmCli asks for by default)
    prints these rows: each field asked for, raw, then the separator."""
    names = asked(fmt or parse.BRIEF_FORMAT)
    return "".join("".join(values[n] + SEP for n in names) + "\n" for values in rows)


def _raw_json(values: dict[str, str]) -> dict[str, Any]:
    """The same job as ``squeue --json`` gives it (a user's text quoted by JSON)."""
    return {
        "job_id": int(values["JobID"]),
        "name": values["Name"],
        "user_name": values["UserName"],
        "user_id": int(values["UserID"]),
        "group_id": int(values["GroupID"]),
        "job_state": values["State"],
        "nodes": values["NodeList"],
        "comment": values["Comment"],
        "standard_output": values["STDOUT"],
        "standard_error": values["STDERR"],
        "current_working_directory": values["WorkDir"],
        "command": values["Command"],
        "start_time": int(values["StartTime"]),
    }


@st.composite
def listings(draw: st.DrawFn) -> list[dict[str, str]]:
    """One to four real jobs (distinct ids and users); each user field a user's text, and
    sometimes a comment carrying whole rows of made-up jobs, or the crafted comment of
    tests/support/listing_forgery.py (with or without the job's own id to close its rows)."""
    ids = draw(st.lists(st.integers(1, 9000), min_size=1, max_size=4, unique=True))
    rows = []
    for n, job_id in enumerate(ids):
        user = {name: draw(_USER_TEXT) for name in USER_FIELDS}
        kind = draw(st.sampled_from(["text", "made-up rows", "crafted"]))
        if kind == "made-up rows":
            fake = _values(draw(st.integers(9001, 99999)), 0, {k: "x" for k in USER_FIELDS})
            user["Comment"] += "\n" + render([fake]) + draw(_USER_TEXT)
        elif kind == "crafted":
            user["Comment"] = forging_comment(
                opt_in="relaunch=on",
                secret="/etc/shadow",
                node="n2",
                other_user="root",
                other_uid=0,
                other_output="/root/x",
                own_job_id=draw(st.sampled_from(["", str(job_id)])),
            )
        rows.append(_values(job_id, 1000 + n, user))
    return rows


def _is_slurms(job: Job, values: dict[str, str]) -> None:
    """``job`` says exactly what Slurm wrote for it."""
    assert job.job_id == values["JobID"]
    assert (job.user, job.user_id, job.group_id) == (
        values["UserName"],
        int(values["UserID"]),
        int(values["GroupID"]),
    )
    assert job.start_time is not None and int(job.start_time.timestamp()) == int(
        values["StartTime"]
    )
    assert job.nodes == [values["NodeList"]]


@settings(FUZZ, max_examples=300)
@given(listings())
def test_the_brief_listing_holds_only_slurms_rows_with_slurms_fields(
    rows: list[dict[str, str]],
) -> None:
    text = render(rows)
    listing = bounded(lambda: parse.BriefListing(text))
    jobs = bounded(listing.all)
    if not listing.valid:
        assert jobs is None
        return
    assert jobs is not None
    by_id = {values["JobID"]: values for values in rows}
    assert [job.job_id for job in jobs] == list(by_id)  # no row made up, none lost
    for job in jobs:
        values = by_id[job.job_id]
        _is_slurms(job, values)
        assert (job.name, job.comment, job.work_dir) == (
            parse._text(values["Name"]),
            parse._text(values["Comment"]),
            parse._text(values["WorkDir"]),
        )


class _Slurm:
    """squeue for these rows: the brief text, or the JSON of the same jobs."""

    def __init__(self, rows: list[dict[str, str]]) -> None:
        self.rows = rows
        self.json = json.dumps({"jobs": [_raw_json(v) for v in rows], "errors": []})

    async def run(
        self, argv: Sequence[str], *, stdin: str | None = None, timeout: float = 30.0
    ) -> CommandResult:
        fmt = next((a.split("=", 1)[1] for a in argv if a.startswith("--Format=")), "")
        out = self.json if "--json" in argv else render(self.rows, fmt)
        return CommandResult(tuple(argv), 0, out, "", 0.0)


@settings(FUZZ, max_examples=100)
@given(listings(), st.integers(1, 99999))
def test_the_watchers_listing_and_one_jobs_read_give_slurms_jobs_only(
    rows: list[dict[str, str]], asked: int
) -> None:
    """What the watcher and the activities read (text, or the JSON when the text is refused):
    the real jobs with their real identity and times, and no other job."""
    by_id = {values["JobID"]: values for values in rows}

    async def read() -> None:
        slurm = SlurmCli(runner=_Slurm(rows))
        jobs = await slurm.list_jobs_brief()
        assert sorted(job.job_id for job in jobs) == sorted(by_id)
        for job in jobs:
            _is_slurms(job, by_id[job.job_id])
        if str(asked) in by_id:
            _is_slurms(
                await SlurmCli(runner=_Slurm(rows)).get_job_brief(str(asked)), by_id[str(asked)]
            )
        else:
            try:
                await SlurmCli(runner=_Slurm(rows)).get_job_brief(str(asked))
            except JobNotFoundError:
                pass
            else:
                raise AssertionError(f"job {asked} is no job of Slurm's, yet it was read")

    bounded(lambda: asyncio.run(read()))


@FUZZ
@given(
    st.fixed_dictionaries({name: _USER_TEXT for name in USER_FIELDS}),
    st.sampled_from([None, 0, 7]),
)
def test_a_jobs_json_record_with_any_user_text_parses_bounded(
    user: dict[str, str], array_task: int | None
) -> None:
    """The JSON listing quotes a user's text; its parser still reads the comment's options and
    expands the output patterns: bounded, the options never hold a control character."""
    raw = _raw_json(_values(42, 1000, user))
    if array_task is not None:
        raw.update(array_job_id=41, array_task_id=array_task)
    job = bounded(lambda: parse.job_from_json(raw))
    assert job.user_id == 1000 and job.comment == parse._text(user["Comment"])
    # No path past PATH_MAX, however many %x (the name) or %99999999999j a pattern holds.
    assert len(job.stdout_path) <= 4096 and len(job.stderr_path) <= 4096
    for key, value in bounded(lambda: job.comment_fields).items():
        assert key.isprintable() and value.replace("\t", " ").isprintable()
    bounded(lambda: job.max_restarts)


_ANY_TEXT = st.one_of(
    st.lists(st.sampled_from([*_PIECES, "Nodes=", "Nodes=n[1-2] ", "ReservationName=x"])).map(
        "".join
    ),
    st.text(max_size=200),
    st.builds(lambda piece: (piece * 65536)[:65536], st.sampled_from(_PIECES)),
)


@FUZZ
@given(_ANY_TEXT)
def test_scontrol_and_sbatch_text_parsers_survive_any_text(text: str) -> None:
    nodes = bounded(lambda: parse.reservation_nodes(text))
    assert all(SEP not in n and "\n" not in n and " " not in n for n in nodes)
    try:
        job_id = bounded(lambda: parse.sbatch_job_id(text))
    except SchedulerError:
        pass
    else:
        assert job_id.isascii() and job_id.isdigit()
    refused = bounded(lambda: _refusals(text, ["4", "42"]))
    assert set(refused) <= {"4", "42"}
    listing = bounded(lambda: parse.BriefListing(text))
    assert listing.all() is None or all(j.job_id.isdigit() for j in listing.all() or [])


_SACCT_FIXTURES = Path(__file__).parents[1] / "fixtures" / "slurm"
_WIDE = (datetime(2026, 1, 1, tzinfo=UTC), datetime(2027, 1, 1, tzinfo=UTC))


@FUZZ
@given(
    release=st.sampled_from(["22.05", "24.11"]),
    name=_USER_TEXT,
    comment=_USER_TEXT,
    work_dir=_USER_TEXT,
    count=st.integers(min_value=1, max_value=4),
)
def test_sacct_answers_with_hostile_fields_give_only_the_jobs_slurm_wrote(
    release: str, name: str, comment: str, work_dir: str, count: int
) -> None:
    """The catch-up's reader of ``sacct --json`` (accounting.ended_jobs): a user's name,
    comment and work dir hold separators, newlines, NULs, escapes or 64 KiB; the answer holds
    ``count`` real jobs. Each comes back once, with its own id, state and end, the user's text
    as its own (never a row, never an option with a control character), within budget."""
    data = json.loads((_SACCT_FIXTURES / f"sacct_{release}.json").read_text())
    template, jobs = data["jobs"][0], []
    for n in range(count):
        job = json.loads(json.dumps(template))
        job["job_id"] = 500 + n
        job["name"], job["comment"]["job"], job["working_directory"] = name, comment, work_dir
        jobs.append(job)
    data["jobs"] = jobs
    read = bounded(lambda: accounting.ended_jobs(json.dumps(data), since=_WIDE[0], until=_WIDE[1]))
    assert sorted(j.job_id for j in read.jobs) == [str(500 + n) for n in range(count)]
    for job in read.jobs:
        assert job.state is JobState.FAILED
        # Slurm's own null words ("(null)", "N/A", ...) read as nothing, as everywhere.
        assert job.comment == parse._text(comment) and job.name == parse._text(name)
        assert all(not _CONTROL_CHARS.search(k + v) for k, v in job.comment_fields.items())
