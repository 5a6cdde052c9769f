"""Pure parsers over Slurm output: the JSON of squeue/sinfo (22.05) and slurmrestd (v0.0.38 and
newer shapes), and the plain-text answers of sbatch and scontrol. Tested on recorded output."""

from __future__ import annotations

import json
import os
import re
from datetime import UTC, datetime
from typing import Any

from relaunch.models import hostlist
from relaunch.models.errors import SchedulerError
from relaunch.models.scheduler import ExitCode, Job, JobState, Node, NodeState

_NULLS = {"", "(null)", "None", "N/A", "Unknown", "n/a"}


def load_json(text: str, what: str) -> dict[str, Any]:
    """Decode a JSON document from Slurm, raising a typed error on garbage."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise SchedulerError(f"{what}: not JSON ({exc.msg} at {exc.pos})") from exc
    if not isinstance(data, dict):
        raise SchedulerError(f"{what}: expected a JSON object")
    return data


def _number(value: Any) -> int | None:
    """Slurm numbers: plain ints (22.05) or ``{"set": bool, "infinite": bool, "number": n}``."""
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return int(value)
    if isinstance(value, dict):
        if value.get("infinite") or value.get("set") is False:
            return None
        return _number(value.get("number"))
    # ASCII digits only ("²".isdigit() holds), and no more than a 64-bit number has.
    if isinstance(value, str) and value.isascii() and value.isdigit() and len(value) <= 20:
        return int(value)
    return None


def _time(value: Any) -> datetime | None:
    seconds = _number(value)
    if not seconds or seconds <= 0:
        return None
    return datetime.fromtimestamp(seconds, tz=UTC)


def _text(value: Any) -> str:
    if value is None:
        return ""
    text = str(value)
    return "" if text in _NULLS else text


def _state_words(value: Any) -> list[str]:
    """``"RUNNING"`` (22.05) or ``["PENDING", "REQUEUED"]`` (23.11+) → upper-case words."""
    if isinstance(value, list):
        return [str(v).upper() for v in value if v]
    if isinstance(value, str) and value:
        return [w for w in value.upper().replace("+", " ").split() if w]
    return []


def _exit_code(value: Any) -> ExitCode:
    if isinstance(value, dict):
        code = _number(value.get("return_code")) or 0
        sig_obj = value.get("signal") or {}
        sig = _number(sig_obj.get("id") if isinstance(sig_obj, dict) else sig_obj) or 0
        return ExitCode(code=code, signal=sig)
    if isinstance(value, str):
        return ExitCode.parse(value)
    number = _number(value)
    return ExitCode.from_wait_status(number) if number else ExitCode()


_PATTERN = re.compile(r"%(\d*)([%AaJjNnstuxb])")
# slurmstepd pads a number to at most 10 digits, whatever width the user's pattern asks for
# (``--output=%99999999999j`` writes ``0000000003``: measured on Slurm 22.05).
_MAX_WIDTH = 10
_PATH_MAX = 4096  # Linux's PATH_MAX: no longer path can be opened


def expand_output_pattern(pattern: str, job: Job, *, array_job_id: str = "", task: str = "") -> str:
    """Resolve a Slurm filename pattern (``job-%j.out``) the way slurmstepd does for the batch
    step, relative to the job's working directory."""

    def sub(m: re.Match[str]) -> str:
        width, code = m.group(1), m.group(2)
        if code == "%":
            return "%"
        values = {
            "A": array_job_id or job.job_id,
            "a": task or "4294967294",
            "J": f"{job.job_id}.batch",
            "j": job.job_id,
            "N": job.batch_host or (job.nodes[0] if job.nodes else ""),
            "n": "0",
            "s": "batch",
            "t": "0",
            "u": job.user,
            "x": job.name,
            "b": str(int(task) % 10) if task.isdigit() else "0",
        }
        value = values[code]
        if width and value.isdigit():
            return value.zfill(_MAX_WIDTH if len(width) > 2 else min(int(width), _MAX_WIDTH))
        return value

    if not pattern or len(pattern) > _PATH_MAX:
        return ""
    # Each %x may add the whole job name: stop as soon as the path is past what can be opened
    # (no path then: the job's output is not read) instead of building megabytes.
    parts, size, at = [], 0, 0
    for m in _PATTERN.finditer(pattern):
        for piece in (pattern[at : m.start()], sub(m)):
            parts.append(piece)
            size += len(piece)
        at = m.end()
        if size > _PATH_MAX:
            return ""
    parts.append(pattern[at:])
    path = "".join(parts)
    if job.work_dir and not os.path.isabs(path):
        path = os.path.join(job.work_dir, path)
    return path if len(path) <= _PATH_MAX else ""


def job_from_json(raw: dict[str, Any]) -> Job:
    """One element of ``jobs`` in squeue --json / slurmrestd, any supported API version."""
    words = _state_words(raw.get("job_state"))
    array_job = _number(raw.get("array_job_id")) or 0
    array_task = _number(raw.get("array_task_id"))
    job_id = str(_number(raw.get("job_id")) or "")
    job = Job(
        job_id=job_id,
        name=_text(raw.get("name")),
        user=_text(raw.get("user_name")),
        user_id=_number(raw.get("user_id")),
        group_id=_number(raw.get("group_id")),
        state=JobState.parse(words[0] if words else None),
        reason=_text(raw.get("state_reason")),
        exit_code=_exit_code(raw.get("exit_code")),
        partition=_text(raw.get("partition")),
        nodes=hostlist.expand(_text(raw.get("nodes"))),
        node_count=_number(raw.get("node_count")) or 0,
        excluded_nodes=hostlist.expand(_text(raw.get("excluded_nodes"))),
        batch_host=_text(raw.get("batch_host")),
        restart_count=_number(raw.get("restart_cnt")) or 0,
        requeue_allowed=bool(raw.get("requeue")),
        comment=_text(raw.get("comment")),
        stdout_pattern=_text(raw.get("standard_output")),
        stderr_pattern=_text(raw.get("standard_error")),
        work_dir=_text(raw.get("current_working_directory")),
        command=_text(raw.get("command")),
        num_tasks=_number(raw.get("tasks")) or 0,
        time_limit_minutes=_number(raw.get("time_limit")),
        submit_time=_time(raw.get("submit_time")),
        eligible_time=_time(raw.get("eligible_time")),
        start_time=_time(raw.get("start_time")),
        end_time=_time(raw.get("end_time")),
    )
    is_array = array_job not in (0, None) and array_task is not None
    default_out = "slurm-%A_%a.out" if is_array else "slurm-%j.out"
    stdout_pattern = job.stdout_pattern or default_out
    stderr_pattern = job.stderr_pattern or stdout_pattern
    kwargs = {"array_job_id": str(array_job) if is_array else "", "task": str(array_task or "")}
    return job.model_copy(
        update={
            "stdout_pattern": stdout_pattern,
            "stderr_pattern": stderr_pattern,
            "stdout_path": expand_output_pattern(stdout_pattern, job, **kwargs),
            "stderr_path": expand_output_pattern(stderr_pattern, job, **kwargs),
        }
    )


class JobListing:
    """One ``squeue --json`` answer, each job parsed only when first asked for.

    A burst of recoveries shares listings (see relaunch.connectors.slurm.fresh), and most
    callers want one job of thousands: parsing every job of every listing would cost about a
    fifth of the worker's CPU in a 500-job burst."""

    def __init__(self, raws: list[dict[str, Any]]) -> None:
        self._raws = raws
        self._index: dict[str, dict[str, Any]] | None = None
        self._parsed: dict[str, Job] = {}
        self._all: list[Job] | None = None

    def get(self, job_id: str) -> Job | None:
        if self._index is None:
            self._index = {str(_number(raw.get("job_id")) or ""): raw for raw in self._raws}
        job = self._parsed.get(job_id)
        if job is None and (raw := self._index.get(job_id)) is not None:
            job = self._parsed[job_id] = job_from_json(raw)
        return job

    def all(self) -> list[Job]:
        if self._all is None:
            self._all = [
                self._parsed.get(str(_number(raw.get("job_id")) or "")) or job_from_json(raw)
                for raw in self._raws
            ]
        return list(self._all)


# ``squeue --Format`` fields for a brief listing (what the watcher needs; no excluded nodes),
# each printed unpadded and followed by a separator. Times come as epoch seconds
# (SLURM_TIME_FORMAT=%s). Slurm 22.05 prints a job's name, comment, paths and command raw: a
# user's newline or separator there reaches the listing as is (tests/adversarial/
# test_listing_forgery.py), and a comment can be made to look like whole rows of other jobs.
# So each row is bracketed by its job id, which only Slurm writes: the row opens with JobID and
# closes with JobID again (BRIEF_CLOSE). See BriefListing for why no user text can then pass.
BRIEF_SEPARATOR = "\x1f"
BRIEF_FIELDS = (
    "JobID",
    "ArrayJobID",
    "ArrayTaskID",
    "Name",
    "UserName",
    "State",
    "Reason",
    "exit_code",
    "Partition",
    "NodeList",
    "NumNodes",
    "BatchHost",
    "RestartCnt",
    "Requeue",
    "Comment",
    "STDOUT",
    "STDERR",
    "WorkDir",
    "Command",
    "NumTasks",
    "TimeLimit",
    "SubmitTime",
    "EligibleTime",
    "StartTime",
    "EndTime",
    "UserID",
    "GroupID",
)
BRIEF_CLOSE = "JobID"
BRIEF_FORMAT = ",".join(f"{name}:0{BRIEF_SEPARATOR}" for name in (*BRIEF_FIELDS, BRIEF_CLOSE))
# What a row splits into: the fields, the closing job id, and the empty text after the last
# separator.
_BRIEF_WIDTH = len(BRIEF_FIELDS) + 2


def _minutes(limit: str) -> int | None:
    """squeue's time limit (``UNLIMITED``, ``30:00``, ``1-00:00:00``) in minutes."""
    if not limit or limit in _NULLS or limit in {"UNLIMITED", "INFINITE"}:
        return None
    days, _, rest = limit.rpartition("-")
    parts = [int(p) for p in rest.split(":")] if rest else []
    while len(parts) < 3:
        parts.insert(0, 0)
    hours, minutes, seconds = parts[-3:]
    return (int(days or 0) * 24 + hours) * 60 + minutes + (1 if seconds else 0)


def _count(value: str) -> int | None:
    """A number in squeue's text; Slurm's NO_VAL/INFINITE markers (0xfffffffe/f) are unset."""
    number = _number(value)
    return None if number is None or number >= 0xFFFFFFFE else number


def output_patterns(text: str, job_id: str) -> tuple[str, str] | None:
    """``(stdout, stderr)`` patterns from ``squeue --jobs=<id> --Format=JobID,STDOUT,STDERR,JobID``
    (each field followed by the separator); None unless it is exactly one row of that job,
    opened and closed by its id (a separator or newline in a path splits it)."""
    lines = text.splitlines()
    if len(lines) != 1:
        return None
    values = lines[0].split(BRIEF_SEPARATOR)
    if len(values) != 5 or values[4] or values[0] != job_id or values[3] != job_id:
        return None
    stdout, stderr = ("" if v == "(null)" else v for v in values[1:3])
    return stdout, stderr or stdout


def jobs_from_brief(text: str) -> list[Job] | None:
    """Parse ``squeue --states=all --noheader --Format=BRIEF_FORMAT``; None when a line does
    not have exactly the expected fields (a separator or newline inside a user's text)."""
    listing = BriefListing(text)
    return listing.all() if listing.valid else None


class BriefListing:
    """One brief ``squeue`` answer, checked whole and indexed by job id; each job parsed only
    when first asked for.

    The listing is ``valid`` only when every line is one whole row: exactly the expected
    fields, a job id (digits) opening it and the same id closing it, and no id twice. Nothing in
    an invalid listing is used (callers read ``squeue --json``, which quotes a user's text).

    Why no user text can pass: Slurm writes the id at both ends of each row and never a newline
    or separator inside an id. A user's newline inside a row splits it into several lines, the
    first opening with the job's id and the last closing with it; for that last line to be
    whole it must open with the same id too, so the id appears twice and the listing is
    refused. Without a newline, any separator of the user's gives the line too many fields. So
    a valid listing holds only Slurm's rows, each field exactly what Slurm wrote for it: no
    row made up inside a comment, and no job's identity, paths or times shifted."""

    def __init__(self, text: str) -> None:
        self.valid = True
        self.why = ""
        self._rows: dict[str, list[str]] = {}
        self._order: list[str] = []
        self._parsed: dict[str, Job] = {}
        # Only squeue's own line end splits rows: str.splitlines() would also split on
        # characters a user may put in a comment (\x1c-\x1e, \x85, \u2028, ...).
        lines = text.split("\n")
        if lines and lines[-1] == "":
            lines.pop()
        for number, line in enumerate(lines, 1):
            values = line.split(BRIEF_SEPARATOR)
            why = ""
            if len(values) != _BRIEF_WIDTH or values[-1] != "":
                why = f"{len(values) - 1} fields, not {_BRIEF_WIDTH - 1}"
            elif values[-2] != values[0] or not (values[0].isdigit() and values[0].isascii()):
                why = "not opened and closed by the same job id"
            elif values[0] in self._rows:
                why = f"job {values[0]} twice"
            if why:
                self.valid, self.why = False, f"line {number}: {why}"
                self._rows.clear()
                self._order.clear()
                return
            self._rows[values[0]] = values
            self._order.append(values[0])

    def get(self, job_id: str) -> Job | None:
        """The job, or None when the listing does not hold it. Only on a valid listing."""
        if not self.valid:
            raise ValueError("an invalid brief listing has no jobs")
        job = self._parsed.get(job_id)
        if job is None and (values := self._rows.get(job_id)) is not None:
            job = _job_from_brief_row(values)
            if job is None:
                raise ValueError(f"job {job_id}: a field does not parse")
            self._parsed[job_id] = job
        return job

    def all(self) -> list[Job] | None:
        """Every job, or None when the listing (or a field in it) does not parse."""
        if not self.valid:
            return None
        try:
            return [job for job_id in self._order if (job := self.get(job_id)) is not None]
        except ValueError:
            return None


def _job_from_brief_row(values: list[str]) -> Job | None:
    raw = dict(zip(BRIEF_FIELDS, values, strict=False))
    try:
        raw_json: dict[str, Any] = {
            "job_id": int(raw["JobID"]),
            "array_job_id": _count(raw["ArrayJobID"]) or 0,
            "array_task_id": _count(raw["ArrayTaskID"]),
            "name": raw["Name"],
            "user_name": raw["UserName"],
            "job_state": raw["State"],
            "state_reason": raw["Reason"],
            # 22.05 prints the raw wait status (768), 23.02 and later `code:signal` (3:0).
            "exit_code": raw["exit_code"]
            if ":" in raw["exit_code"]
            else (_count(raw["exit_code"]) or 0),
            "partition": raw["Partition"],
            "nodes": raw["NodeList"],
            "node_count": _count(raw["NumNodes"]) or 0,
            "batch_host": raw["BatchHost"],
            "restart_cnt": _count(raw["RestartCnt"]) or 0,
            "requeue": raw["Requeue"] == "1",
            "comment": raw["Comment"],
            "standard_output": raw["STDOUT"],
            "standard_error": raw["STDERR"],
            "current_working_directory": raw["WorkDir"],
            "command": raw["Command"],
            "tasks": _count(raw["NumTasks"]) or 0,
            "time_limit": _minutes(raw["TimeLimit"]),
            "submit_time": _count(raw["SubmitTime"]),
            "eligible_time": _count(raw["EligibleTime"]),
            "start_time": _count(raw["StartTime"]),
            "end_time": _count(raw["EndTime"]),
            "user_id": _count(raw["UserID"]),
            "group_id": _count(raw["GroupID"]),
        }
    except ValueError:
        return None
    if raw_json["array_job_id"] == raw_json["job_id"] and raw_json["array_task_id"] is None:
        raw_json["array_job_id"] = 0  # squeue prints a plain job's own id here
    return job_from_json(raw_json)


def json_errors(data: dict[str, Any]) -> list[str]:
    """The ``errors`` Slurm put in a JSON answer (squeue/sinfo exit 0 even when they fail)."""
    out = []
    for error in data.get("errors") or []:
        if isinstance(error, dict):
            text = error.get("description") or error.get("error") or "unspecified error"
            source = error.get("source")
            out.append(f"{source}: {text}" if source else str(text))
        else:
            out.append(str(error))
    return out


def jobs_from_json(text: str) -> list[Job]:
    """Parse the whole answer of ``squeue --json`` or ``GET /slurm/v0.0.38/jobs``."""
    data = load_json(text, "job list")
    return [job_from_json(raw) for raw in data.get("jobs") or []]


def node_from_json(raw: dict[str, Any]) -> Node:
    """One element of ``nodes`` in sinfo --json / slurmrestd."""
    words = _state_words(raw.get("state"))
    base = NodeState.parse(words[0] if words else None)
    flags = [w for w in words[1:]]
    for flag in raw.get("state_flags") or []:
        flag = str(flag).upper()
        if flag not in flags:
            flags.append(flag)
    # 22.05 reports a drained idle node as base "drained"/"draining" in some paths.
    if words and words[0] in {"DRAINED", "DRAINING", "DRAIN"} and "DRAIN" not in flags:
        flags.insert(0, "DRAIN")
    return Node(
        name=_text(raw.get("name")),
        state=base,
        flags=flags,
        reason=_text(raw.get("reason")),
        reason_user=_text(raw.get("reason_set_by_user")),
        reason_time=_time(raw.get("reason_changed_at")),
        partitions=[str(p) for p in raw.get("partitions") or []],
        cpus=_number(raw.get("cpus")) or 0,
        alloc_cpus=_number(raw.get("alloc_cpus")) or 0,
        address=_text(raw.get("address")),
        port=_number(raw.get("port")) or 0,
    )


def nodes_from_json(text: str) -> list[Node]:
    """Parse the whole answer of ``sinfo --json`` or ``GET /slurm/v0.0.38/nodes``."""
    return nodes_from_data(load_json(text, "node list"))


def nodes_from_data(data: dict[str, Any]) -> list[Node]:
    """Nodes from decoded sinfo/slurmrestd JSON, first occurrence of each name kept."""
    seen: dict[str, Node] = {}
    for raw in data.get("nodes") or []:
        node = node_from_json(raw)
        if node.name and node.name not in seen:
            seen[node.name] = node
    return list(seen.values())


def reservation_nodes(text: str) -> list[str]:
    """The ``Nodes=`` of ``scontrol show reservation <name>`` (a hostlist, as Slurm writes it),
    or nothing without one. Only an operator names a reservation or its nodes."""
    m = re.search(r"(?:^|\s)Nodes=(\S*)", text)
    return [m.group(1)] if m else []


def sbatch_job_id(text: str) -> str:
    """``sbatch --parsable`` prints ``<id>`` or ``<id>;<cluster>``."""
    first = text.strip().splitlines()[0] if text.strip() else ""
    job_id = first.split(";")[0].strip()
    if not job_id.isdigit():
        raise SchedulerError(f"sbatch printed no job id: {text.strip()[:200]!r}")
    return job_id
