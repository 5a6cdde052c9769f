"""Ended jobs from Slurm's accounting: ``sacct --json`` of 22.05 (data parser v0.0.38) and of
24.11 (v0.0.42), parsed into :class:`Job` records for the watcher's catch-up.

Why JSON: a job's name and comment are its user's text and may hold newlines and ``|``; in
sacct's ``--parsable2`` text a comment such as ``x\\n99|NODE_FAIL|...`` would be read as a row
of its own. JSON keeps every field in its place, so a user's text can only ever be that job's
name or comment. Identity and times (job id, state, end time, nodes, partition) come from
fields slurmdbd fills, which the job's user cannot write; the comment is read only for the
opt-in (``relaunch=on``), as the live watcher reads it.

The answer is bounded: at most ``limit`` jobs are kept (the rest counted in ``dropped``), and
only allocations (``-X``) in the states asked for whose end lies in the window asked for.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from relaunch.connectors.slurm.parse import _number, _state_words, _text, _time, load_json
from relaunch.models import hostlist
from relaunch.models.errors import SchedulerError
from relaunch.models.scheduler import ABNORMAL_END_STATES, ExitCode, Job, JobState

# What a job end may call for recovery (JobState.is_abnormal_end), as sacct's --state names it.
ENDED_STATES = ABNORMAL_END_STATES
MAX_ROWS = 5_000  # jobs kept from one answer, at most
MAX_NODES = 100_000  # hostlist expansion bound per job


class AccountingDisabledError(SchedulerError):
    """The cluster keeps no accounting (AccountingStorageType=accounting_storage/none)."""

    retryable = False


# What sacct prints where slurm.conf has no accounting storage (22.05 and 24.11).
_DISABLED = ("accounting storage is disabled", "slurmdbd: no such", "accounting_storage/none")


def raise_disabled(output: str) -> None:
    """AccountingDisabledError when sacct's output says the cluster keeps no accounting."""
    if any(marker in output.lower() for marker in _DISABLED):
        raise AccountingDisabledError(
            "Slurm keeps no job accounting on this cluster",
            hint="set AccountingStorageType=accounting_storage/slurmdbd (docs/catch-up.md)",
        )


@dataclass
class EndedJobs:
    """What one sacct read gave: the jobs kept, and how many were left out (over the limit)."""

    jobs: list[Job] = field(default_factory=list)
    dropped: int = 0


def sacct_argv(
    since: datetime,
    now: datetime,
    *,
    states: Iterable[JobState] = ENDED_STATES,
    slack_s: int = 60,
) -> list[str]:
    """``sacct`` bounded by a window, the states asked for, allocations only (``-X``), all
    users, in JSON. The window is said relative to the clock of the host sacct runs on
    (``-S now-<s>``): it means the same in every time zone and over SSH; ``slack_s`` covers
    clocks that disagree, and the answer is filtered again by exact end time."""
    back = max(1, math.ceil((now - since).total_seconds()) + slack_s)
    return [
        "sacct",
        "--json",
        "-X",
        "--allusers",
        "-S",
        f"now-{back}seconds",
        "-E",
        "now",
        "--state=" + ",".join(s.value for s in states),
    ]


def ended_jobs(
    text: str,
    *,
    since: datetime,
    until: datetime,
    states: Sequence[JobState] = ENDED_STATES,
    limit: int = MAX_ROWS,
) -> EndedJobs:
    """The jobs of one ``sacct --json`` answer that ended in ``[since, until]`` in one of
    ``states``, oldest end first, at most ``limit`` (sacct's own filters are checked again
    here: the answer is not trusted to have applied them)."""
    data = load_json(text, "sacct")
    raw = data.get("jobs")
    if not isinstance(raw, list):
        raise SchedulerError("sacct: the answer has no job list")
    wanted = set(states)
    out: list[Job] = []
    for item in raw:
        if not isinstance(item, dict):
            continue
        job = job_from_sacct(item)
        if job is None or job.state not in wanted or job.end_time is None:
            continue
        if not since <= job.end_time <= until:
            continue
        out.append(job)
    out.sort(key=lambda j: (j.end_time or until, j.job_id))
    return EndedJobs(jobs=out[:limit], dropped=max(0, len(out) - limit))


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def job_from_sacct(raw: dict[str, Any]) -> Job | None:
    """One accounting record as a :class:`Job` (None when it has no usable job id)."""
    job_id = _number(raw.get("job_id"))
    if job_id is None or job_id <= 0:
        return None
    state_raw = raw.get("state")
    state_words = _state_words(state_raw.get("current") if isinstance(state_raw, dict) else "")
    state = JobState.parse(state_words[0] if state_words else None)
    times = _dict(raw.get("time"))
    comment = raw.get("comment")
    comment_text = _text(comment.get("job")) if isinstance(comment, dict) else _text(comment)
    nodes_text = _text(raw.get("nodes"))
    try:
        nodes = hostlist.expand(nodes_text, limit=MAX_NODES) if nodes_text else []
    except ValueError:
        nodes = []
    exit_raw = _dict(raw.get("exit_code"))
    code = _number(exit_raw.get("return_code"))
    sig = _number(_dict(exit_raw.get("signal")).get("id"))
    return Job(
        job_id=str(job_id),
        name=_text(raw.get("name")),
        user=_text(raw.get("user")),
        state=state,
        reason=_text(state_raw.get("reason")) if isinstance(state_raw, dict) else "",
        exit_code=ExitCode(code=code or 0, signal=sig or 0),
        partition=_text(raw.get("partition")),
        nodes=nodes,
        node_count=len(nodes),
        restart_count=_number(raw.get("restart_cnt")) or 0,
        comment=comment_text,
        work_dir=_text(raw.get("working_directory")),
        submit_time=_time(times.get("submission")),
        start_time=_time(times.get("start")),
        end_time=_time(times.get("end")),
    )
