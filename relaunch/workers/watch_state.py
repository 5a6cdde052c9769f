"""What the watcher keeps per watched job between polls, and what one look at a job found."""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from relaunch.connectors.logs import FileTail
from relaunch.connectors.telemetry import TelemetryTail
from relaunch.detection.findings import CLOCK_SKEW
from relaunch.detection.kernel_lines import KernelRecord
from relaunch.detection.lines import Line, LineBuffer
from relaunch.detection.progress import ProgressTracker
from relaunch.detection.signatures import SignatureMatch
from relaunch.models.bundle import TelemetrySample
from relaunch.models.recovery import Detection, DetectionSource
from relaunch.models.scheduler import (
    HANG_AFTER_KEY,
    LAG_AFTER_KEY,
    Job,
    JobState,
    comment_duration,
)

logger = logging.getLogger("relaunch.workers.watcher")


@dataclass
class WatchStats:
    """Counters for metrics and `relaunch dev status`."""

    polls: int = 0  # job listings (each with its nodes)
    active_polls: int = 0  # listings of the active jobs between full ones (watch_cadence.py)
    node_polls: int = 0  # node listings between job listings (watch_cadence.py)
    last_poll_s: float = 0.0
    watched_jobs: int = 0
    detections: int = 0
    errors: int = 0
    last_error: str = ""
    long_lines: int = 0  # job-log lines longer than the match limit, matched on their start
    backlogged: int = 0  # job passes that left log bytes unread (the job's budget was spent)
    ignored_progress: int = 0  # progress lines naming a rank outside the job's task count
    probes: int = 0  # liveness probes sent (all nodes, all rounds)
    probe_failures: int = 0  # of which failed (refused, timed out, unreachable)
    probe_errors: int = 0  # rounds that could not probe at all (e.g. the SSH host failed)
    probed_nodes: int = 0  # nodes probed now
    unreachable_nodes: int = 0  # nodes the probes call unreachable now
    probe_alive: int = 0  # probe streaks not reported: a timeout, but Slurm or the agent vouch
    heartbeat_nodes: int = 0  # nodes whose agent's heartbeat is followed now


# A job in these states writes no output: once it was seen in one this long (its last lines
# given time to land on a shared filesystem) and its log read to the end, the log is not read
# again unless the job runs again (a requeue).
ENDED_GRACE_S = 3.0
_NOT_WRITING = frozenset(
    {JobState.PENDING, JobState.REQUEUED, JobState.REQUEUE_HOLD, JobState.REQUEUE_FED}
)


def writes_output(job: Job) -> bool:
    """Whether the job may still write to its output files (it has not ended, nor waits)."""
    return not (job.state.is_terminal or job.state in _NOT_WRITING)


@dataclass(frozen=True)
class LogPace:
    """How often a job's log is read (docs/detection.md, "Logs read by need"). A log that grew
    at its last read is read at every pass (``fast_s`` apart); one quiet for ``q`` seconds
    (``q`` >= ``fast_s``) is read again ``min(q, quiet_max_s)`` later: 0.25 s, 0.5 s, then
    every second by default. A log whose job no longer writes is read for ``ended_grace_s``
    after the job was first seen so, until a read finds no more waiting, then no more."""

    fast_s: float
    quiet_max_s: float
    ended_grace_s: float = ENDED_GRACE_S


@dataclass
class Stream:
    """One followed file: its tail, its partial last line, and what the last read got.
    ``behind`` is True when the last read stopped at its limit (more may be waiting);
    ``last_ops`` the file operations (open, stat, read) the last read made.

    With a ``pace`` (a job's log) it is read by need: :meth:`due` says whether to read it in
    this pass, :meth:`paced` plans the next read from what this one found. The clock is the
    pass's (monotonic, or the injected time); a clock that went back reads at once."""

    tail: FileTail
    lines: LineBuffer = field(default_factory=LineBuffer)
    truncations: int = 0
    failing: bool = False
    last_read: int = 0
    behind: bool = False
    last_ops: tuple[int, int, int] = (0, 0, 0)
    pace: LogPace | None = None
    read_at: float = -math.inf  # the clock of the last read
    grew_at: float | None = None  # the clock of the last read that gave bytes
    next_at: float = -math.inf  # not read before (less half a pass of slack)
    ended_at: float | None = None  # when the job was first seen not writing (None: it writes)
    done: bool = False  # the job no longer writes and its log was read to the end

    def due(self, clock: float, writing: bool) -> bool:
        """Whether to read the file in the pass at ``clock``; ``writing``: whether its job may
        still write to it (a job that runs again after it ended is read again)."""
        pace = self.pace
        if pace is None:
            return True
        if writing:
            if self.ended_at is not None:  # it runs again (requeued): read it as a new log
                self.grew_at, self.next_at = clock, -math.inf
            self.ended_at, self.done = None, False
        elif self.ended_at is None or clock < self.ended_at:
            self.ended_at = clock
        if self.done:
            return False
        if clock < self.read_at:
            return True
        return clock >= self.next_at - pace.fast_s / 2

    def paced(self, clock: float, writing: bool) -> None:
        """Plan the next read after a read at ``clock`` (see :class:`LogPace`)."""
        pace = self.pace
        if pace is None:
            return
        went_back = clock < self.read_at or (self.grew_at is not None and clock < self.grew_at)
        if self.grew_at is None or went_back or self.last_read or self.behind:
            self.grew_at = clock
        self.read_at = clock
        quiet = clock - self.grew_at
        self.next_at = clock + (min(quiet, pace.quiet_max_s) if quiet >= pace.fast_s else 0.0)
        ended = None if writing else self.ended_at
        self.done = ended is not None and clock - ended >= pace.ended_grace_s and not self.behind

    def read(self, limit: int | None = None) -> list[Line]:
        """The complete lines appended since the last read, reading at most ``limit`` bytes
        (else the tail's own ``max_read``): the rest is read next time."""
        self.last_read, self.behind = 0, False
        configured = self.tail.max_read
        asked = configured if limit is None else max(1, min(limit, configured))
        self.tail.max_read = asked
        before = self.tail.ops.as_tuple()
        try:
            data = self.tail.read()
        except OSError as exc:
            if not self.failing:
                logger.warning("cannot read log", extra={"path": self.tail.path, "error": str(exc)})
            self.failing = True
            return []
        finally:
            self.tail.max_read = configured
            after = self.tail.ops.as_tuple()
            self.last_ops = (after[0] - before[0], after[1] - before[1], after[2] - before[2])
        self.failing = False
        self.last_read, self.behind = len(data), len(data) >= asked
        if self.tail.truncations != self.truncations:
            self.truncations = self.tail.truncations
            self.lines.discard_partial()
        return self.lines.feed(data) if data else []


@dataclass
class NodeFeed:
    """One node's kernel log and telemetry, read once per pass whatever the number of watched
    jobs on the node (a node log read per job and node was most of a pass at thousands of jobs).
    ``matches`` and ``telemetry_matches`` hold what the read in pass ``read_in`` found."""

    log: Stream | None
    telemetry: TelemetryTail | None
    gpus: dict[int | None, TelemetrySample] = field(default_factory=dict)
    matches: list[SignatureMatch] = field(default_factory=list)
    telemetry_matches: list[SignatureMatch] = field(default_factory=list)
    read_in: int = -1  # -1: never read (its first telemetry read is the GPUs' baseline)
    # What the log's last line said about its record (a piece after a newline), between reads.
    record: KernelRecord = field(default_factory=KernelRecord)


@dataclass
class JobWatch:
    job: Job
    restart_count: int
    from_start: bool
    progress: ProgressTracker
    logs: dict[str, Stream] = field(default_factory=dict)
    # The pass in which this job first looked at each of its nodes: what a node's feed read in
    # that pass (or before) is not this job's news.
    node_since: dict[str, int] = field(default_factory=dict)
    drain_seen: dict[str, bool] = field(default_factory=dict)
    # (hang floor, lag floor) for this job, and the comment they were read from: a job's
    # comment may say `hang_after=` / `lag_after=`; read again only when the comment changes.
    floors: tuple[float, float] = (0.0, 0.0)
    floors_comment: str | None = None
    emitted: set[tuple[int, str, tuple[str, ...]]] = field(default_factory=set)
    # Passes in a row that left some of this job's log unread (its scanning budget was spent).
    backlog_passes: int = 0
    # The submit time of the attempt being watched. Slurm gives a requeued job a new submit
    # time, so a detection of the attempt a requeue interrupted must carry the old one (it is
    # how a recovery tells its own job from a later job given the same id).
    submitted_at: datetime | None = None

    def limits(self, hang_floor: float, lag_floor: float) -> tuple[float, float]:
        """The job's (hang floor, lag floor): the configured ones, or what its comment says
        (``hang_after=``, ``lag_after=``). Read again only when the comment changes; a bad
        value is said once and ignored (the comment is the job user's: never an error here,
        and it only ever sets this job's limits)."""
        job = self.job
        if self.floors_comment == job.comment:
            return self.floors
        floors = [hang_floor, lag_floor]
        fields = job.comment_fields if job.comment else {}
        for index, key in enumerate((HANG_AFTER_KEY, LAG_AFTER_KEY)):
            if key not in fields:
                continue
            try:
                floors[index] = comment_duration(fields[key])
            except ValueError as exc:
                logger.warning(
                    "job %s: ignoring %s in its comment: %s",
                    job.job_id,
                    key,
                    exc,
                    extra={"job_id": job.job_id},
                )
        self.floors, self.floors_comment = (floors[0], floors[1]), job.comment
        return self.floors

    def first_time(self, detection: Detection) -> bool:
        """Dedupe: one report per (attempt, kind, nodes)."""
        key = (detection.attempt, detection.kind, tuple(detection.nodes))
        if key in self.emitted:
            return False
        self.emitted.add(key)
        return True


@dataclass
class Poll:
    """One watched job in one poll, and the detections made for it."""

    cluster: str
    job: Job
    watch: JobWatch
    attempt: int
    wall: datetime
    clock: float
    found: list[Detection] = field(default_factory=list)
    # Taken when the poll is made: a requeue seen in this poll moves the watch to the new
    # attempt, while this poll still reports the attempt the requeue interrupted.
    submitted_at: datetime | None = None

    def __post_init__(self) -> None:
        self.submitted_at = self.watch.submitted_at

    def ago(self, seconds: float) -> datetime:
        return self.wall - timedelta(seconds=seconds)

    def rank_node(self, rank: int) -> str | None:
        """The node ``rank`` runs on: the ``node=`` its progress lines name, else Slurm's
        default block layout (task ``i`` of ``n`` per node on ``job.nodes[i // n]``)."""
        nodes, tasks = self.job.nodes, self.job.num_tasks
        named = self.watch.progress.rank_nodes.get(rank, "").split(".")[0]
        if named in nodes:
            return named
        if not nodes or rank < 0:
            return None
        per_node = tasks // len(nodes) if tasks % len(nodes) == 0 else 1
        index = rank // max(per_node, 1)
        return nodes[index] if index < len(nodes) else None

    def add(
        self,
        kind: str,
        *,
        source: DetectionSource = DetectionSource.SCHEDULER,
        nodes: list[str] | None = None,
        text: str = "",
        fault_time: datetime | None = None,
        signature: str | None = None,
    ) -> None:
        self.found.append(
            Detection(
                cluster=self.cluster,
                job_id=self.job.job_id,
                attempt=self.attempt,
                source=source,
                kind=kind,
                signature=signature,
                text=text,
                nodes=sorted(nodes or []),
                fault_time=fault_time,
                detected_at=self.wall,
                submitted_at=self.submitted_at,
            )
        )

    def add_match(self, match: SignatureMatch, nodes: list[str], source: DetectionSource) -> None:
        kind, when = f"signature:{match.signature}", match.timestamp
        if source is DetectionSource.JOB_LOG and when is not None:
            # A job's line may state any time: one later than now or before the submission
            # is its say-so, not when the fault happened.
            submitted = self.job.submit_time
            if when > self.wall + CLOCK_SKEW or (submitted and when < submitted - CLOCK_SKEW):
                when = None
        self.add(
            kind,
            source=source,
            nodes=nodes,
            text=match.text,
            fault_time=when,
            signature=match.signature,
        )
