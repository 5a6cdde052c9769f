"""What Relaunch knows about a scheduler's jobs and nodes, independent of the backend."""

from __future__ import annotations

import re
from collections.abc import Collection, Sequence
from datetime import datetime
from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field


class JobState(StrEnum):
    """Slurm job base states. Anything unrecognised maps to UNKNOWN, never to an error."""

    PENDING = "PENDING"
    RUNNING = "RUNNING"
    SUSPENDED = "SUSPENDED"
    COMPLETING = "COMPLETING"
    COMPLETED = "COMPLETED"
    CANCELLED = "CANCELLED"
    FAILED = "FAILED"
    TIMEOUT = "TIMEOUT"
    NODE_FAIL = "NODE_FAIL"
    PREEMPTED = "PREEMPTED"
    BOOT_FAIL = "BOOT_FAIL"
    DEADLINE = "DEADLINE"
    OUT_OF_MEMORY = "OUT_OF_MEMORY"
    REQUEUED = "REQUEUED"
    REQUEUE_HOLD = "REQUEUE_HOLD"
    REQUEUE_FED = "REQUEUE_FED"
    RESIZING = "RESIZING"
    REVOKED = "REVOKED"
    SIGNALING = "SIGNALING"
    SPECIAL_EXIT = "SPECIAL_EXIT"
    STAGE_OUT = "STAGE_OUT"
    STOPPED = "STOPPED"
    CONFIGURING = "CONFIGURING"
    UNKNOWN = "UNKNOWN"

    @classmethod
    def parse(cls, value: str | None) -> JobState:
        """Map a Slurm state string (``RUNNING``, ``CANCELLED by 0``, ``node_fail``) to the enum."""
        if not value:
            return cls.UNKNOWN
        head = value.strip().split()[0].upper()
        try:
            return cls(head)
        except ValueError:
            return cls.UNKNOWN

    @property
    def is_active(self) -> bool:
        """Pending or holding resources: the job is not over."""
        return self in _ACTIVE_JOB_STATES

    @property
    def is_terminal(self) -> bool:
        return self in _TERMINAL_JOB_STATES

    @property
    def is_abnormal_end(self) -> bool:
        """Ended in a way that may call for recovery."""
        return self in _ABNORMAL_JOB_STATES


_ACTIVE_JOB_STATES = frozenset(
    {
        JobState.PENDING,
        JobState.RUNNING,
        JobState.SUSPENDED,
        JobState.COMPLETING,
        JobState.CONFIGURING,
        JobState.REQUEUED,
        JobState.REQUEUE_HOLD,
        JobState.REQUEUE_FED,
        JobState.RESIZING,
        JobState.SIGNALING,
        JobState.STAGE_OUT,
        JobState.STOPPED,
    }
)
_TERMINAL_JOB_STATES = frozenset(
    {
        JobState.COMPLETED,
        JobState.CANCELLED,
        JobState.FAILED,
        JobState.TIMEOUT,
        JobState.NODE_FAIL,
        JobState.PREEMPTED,
        JobState.BOOT_FAIL,
        JobState.DEADLINE,
        JobState.OUT_OF_MEMORY,
        JobState.REVOKED,
        JobState.SPECIAL_EXIT,
    }
)
# The ends that may call for a recovery, in the order sacct's --state lists them.
ABNORMAL_END_STATES: tuple[JobState, ...] = (
    JobState.FAILED,
    JobState.NODE_FAIL,
    JobState.OUT_OF_MEMORY,
    JobState.TIMEOUT,
    JobState.PREEMPTED,
    JobState.CANCELLED,
    JobState.BOOT_FAIL,
    JobState.DEADLINE,
)
_ABNORMAL_JOB_STATES = frozenset(ABNORMAL_END_STATES)


class NodeState(StrEnum):
    """Slurm node base states (the part before any ``+FLAG``)."""

    IDLE = "IDLE"
    ALLOCATED = "ALLOCATED"
    MIXED = "MIXED"
    DOWN = "DOWN"
    ERROR = "ERROR"
    FUTURE = "FUTURE"
    UNKNOWN = "UNKNOWN"

    @classmethod
    def parse(cls, value: str | None) -> NodeState:
        if not value:
            return cls.UNKNOWN
        head = value.strip().split("+")[0].rstrip("*~#!%$@^-").upper()
        head = {"ALLOC": "ALLOCATED", "MIX": "MIXED", "DRAINED": "IDLE", "DRAIN": "IDLE"}.get(
            head, head
        )
        try:
            return cls(head)
        except ValueError:
            return cls.UNKNOWN


class NodeFlag(StrEnum):
    """Node state flags Relaunch reasons about; others are kept as plain strings."""

    DRAIN = "DRAIN"
    NOT_RESPONDING = "NOT_RESPONDING"
    FAIL = "FAIL"
    COMPLETING = "COMPLETING"
    MAINTENANCE = "MAINTENANCE"
    REBOOT_REQUESTED = "REBOOT_REQUESTED"
    POWERED_DOWN = "POWERED_DOWN"
    RESERVED = "RESERVED"


class ExitCode(BaseModel):
    """A job's exit code as Slurm prints it, ``<return code>:<signal>``."""

    model_config = ConfigDict(frozen=True)

    code: int = 0
    signal: int = 0

    @classmethod
    def parse(cls, text: str | None) -> ExitCode:
        """Parse ``"1:0"``; anything malformed is 0:0."""
        if not text or ":" not in text:
            return cls()
        code, _, sig = text.partition(":")
        try:
            return cls(code=int(code), signal=int(sig))
        except ValueError:
            return cls()

    @classmethod
    def from_wait_status(cls, status: int) -> ExitCode:
        """Decode a raw wait(2) status, the form Slurm 22.05's JSON uses."""
        return cls(code=(status >> 8) & 0xFF, signal=status & 0x7F)

    def __str__(self) -> str:
        return f"{self.code}:{self.signal}"


class Job(BaseModel):
    """One job as the scheduler reports it, with hostlists expanded and output paths resolved."""

    job_id: str
    name: str = ""
    user: str = ""
    user_id: int | None = Field(default=None, description="the job's uid, as Slurm lists it")
    group_id: int | None = Field(default=None, description="the job's gid, as Slurm lists it")
    state: JobState = JobState.UNKNOWN
    reason: str = ""
    exit_code: ExitCode = Field(default_factory=ExitCode)
    partition: str = ""
    nodes: list[str] = Field(default_factory=list)
    node_count: int = 0
    excluded_nodes: list[str] = Field(default_factory=list)
    batch_host: str = ""
    restart_count: int = 0
    requeue_allowed: bool = False
    comment: str = ""
    stdout_path: str = ""
    stderr_path: str = ""
    stdout_pattern: str = ""
    stderr_pattern: str = ""
    work_dir: str = ""
    command: str = ""
    num_tasks: int = 0
    time_limit_minutes: int | None = None
    submit_time: datetime | None = None
    eligible_time: datetime | None = None
    start_time: datetime | None = None
    end_time: datetime | None = None

    @property
    def held(self) -> bool:
        return self.state is JobState.PENDING and self.reason.startswith("JobHeld")

    @property
    def comment_fields(self) -> dict[str, str]:
        """``relaunch=on,max_restarts=2`` → ``{"relaunch": "on", "max_restarts": "2"}``.

        The comment is its user's text: an option with a control character anywhere in it (a
        newline, Slurm's text listing's separator, an escape) is no option at all, and only
        spaces and tabs around one are trimmed (``str.strip`` would trim ``\x1c``-``\x1f``)."""
        fields: dict[str, str] = {}
        for part in self.comment.split(","):
            if _CONTROL.search(part):
                continue
            key, sep, value = part.strip(" \t").partition("=")
            if key and sep:
                fields[key] = value
        return fields

    @property
    def garbled_option(self) -> bool:
        """Whether one of Relaunch's own options (``relaunch...``) holds a control character:
        no option at all (see :attr:`comment_fields`), and not to be read as if it were absent
        (a lost ``relaunch_cluster=`` would hand the job to every Relaunch on the cluster)."""
        return any(
            _CONTROL.search(part) and _CONTROL.sub("", part).strip().lower().startswith("relaunch")
            for part in self.comment.split(",")
        )

    @property
    def max_restarts(self) -> int | None:
        """The job's own restart budget (``--comment relaunch=on,max_restarts=N``), if any."""
        value = self.comment_fields.get("max_restarts", "")
        # The job's user writes it: nine digits at most (a budget, not a number to parse).
        return int(value) if value.isascii() and value.isdigit() and len(value) <= 9 else None

    @property
    def train_nodes(self) -> int | None:
        """How many of the job's nodes train (``--comment relaunch=on,train_nodes=N``): the
        rest of its allocation are spares it trains on again when one is lost (docs/spares.md).
        The job's own setting: it only ever decides how that job restarts, never who is to
        blame."""
        value = self.comment_fields.get("train_nodes", "")
        if not (value.isascii() and value.isdigit() and len(value) <= 6):
            return None
        return int(value) or None


def spare_left(nodes: Collection[str], train_nodes: int | None, leaving: Collection[str]) -> bool:
    """Whether a job on ``nodes`` that trains on ``train_nodes`` of them keeps enough to train
    on once ``leaving`` (some of its nodes) leave it: it trains again on a spare instead of a
    requeue (docs/spares.md)."""
    gone = set(leaving) & set(nodes)
    return bool(train_nodes) and bool(gone) and len(set(nodes) - gone) >= (train_nodes or 0)


# Per-job limits a job's comment may set (seconds, or with a unit: 90s, 10m, 2h); each only
# ever affects the job whose comment says it.
HANG_AFTER_KEY = "hang_after"
LAG_AFTER_KEY = "lag_after"
MIN_AFTER_S = 5.0
MAX_AFTER_S = 7 * 86400.0
_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f-\x9f\u2028\u2029]")
_DURATION = re.compile(r"(\d{1,9}(?:\.\d{1,3})?)([smh]?)")
_UNIT_S = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0}


def comment_duration(value: str) -> float:
    """A comment field's duration in seconds: ``300``, ``300s``, ``10m`` or ``2h``, within
    ``MIN_AFTER_S`` to ``MAX_AFTER_S``. ValueError (saying why) for anything else."""
    text = value.strip().lower()
    found = _DURATION.fullmatch(text)
    if not found:
        raise ValueError(f"{value[:40]!r} is not a duration (e.g. 300, 90s, 10m, 2h)")
    seconds = float(found.group(1)) * _UNIT_S[found.group(2)]
    if not MIN_AFTER_S <= seconds <= MAX_AFTER_S:
        raise ValueError(f"{value[:40]!r} is outside {MIN_AFTER_S:g} s to 7 days")
    return seconds


OPT_IN_KEY = "relaunch"
CLUSTER_KEY = "relaunch_cluster"
_ON = frozenset({"on", "yes", "true", "1"})
_OFF = frozenset({"off", "no", "false", "0"})


def watched(job: Job, cluster: str, *, partitions: Sequence[str], opt_in_comment: bool) -> bool:
    """Whether Relaunch's ``cluster`` looks after ``job``: opted in by comment
    (``relaunch=on``) or in a watched partition. ``relaunch=off`` always opts out, and so does
    an option of Relaunch's holding a control character; a job that names another Relaunch
    cluster (``relaunch_cluster=<name>``, for several Relaunch deployments on one Slurm
    cluster) belongs to that one."""
    fields = job.comment_fields
    flag = fields.get(OPT_IN_KEY, "").strip().lower()
    if flag in _OFF or job.garbled_option:  # a garbled option of ours: not ours to guess
        return False
    named = fields.get(CLUSTER_KEY, "").strip()
    if named and named != cluster:
        return False
    if opt_in_comment and flag in _ON:
        return True
    return any(p in partitions for p in job.partition.split(",") if p)


class Node(BaseModel):
    """One node as the scheduler reports it."""

    name: str
    state: NodeState = NodeState.UNKNOWN
    flags: list[str] = Field(default_factory=list)
    reason: str = ""
    reason_user: str = ""
    reason_time: datetime | None = None
    partitions: list[str] = Field(default_factory=list)
    cpus: int = 0
    alloc_cpus: int = 0
    address: str = ""
    port: int = 0

    @property
    def drain_flag(self) -> bool:
        """Marked to drain (drained or still draining)."""
        return NodeFlag.DRAIN in self.flags

    @property
    def drained(self) -> bool:
        """Drained and idle: nothing runs there any more."""
        return self.drain_flag and self.alloc_cpus == 0 and self.state is not NodeState.ALLOCATED

    @property
    def responding(self) -> bool:
        return NodeFlag.NOT_RESPONDING not in self.flags and self.state is not NodeState.DOWN

    @property
    def display_state(self) -> str:
        return "+".join([self.state.value, *self.flags])


class ActionResult(BaseModel):
    """What an idempotent scheduler action did, with the fresh state read before and after."""

    action: str
    target: str
    changed: bool
    note: str = ""
    before: str = ""
    after: str = ""
    new_job_id: str | None = None
