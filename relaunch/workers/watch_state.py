"""What the watcher keeps per watched job between polls, and what one look at a job found."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from relaunch.connectors.logs import FileTail
from relaunch.connectors.telemetry import TelemetryTail
from relaunch.detection.lines import Line, LineBuffer
from relaunch.detection.progress import ProgressTracker
from relaunch.detection.signatures import SignatureMatch
from relaunch.models.bundle import TelemetrySample
from relaunch.models.recovery import Detection, DetectionSource
from relaunch.models.scheduler import Job

logger = logging.getLogger("relaunch.workers.watcher")


@dataclass
class Stream:
    tail: FileTail
    lines: LineBuffer = field(default_factory=LineBuffer)
    truncations: int = 0
    failing: bool = False

    def read(self) -> list[Line]:
        try:
            data = self.tail.read()
        except OSError as exc:
            if not self.failing:
                logger.warning("cannot read log", extra={"path": self.tail.path, "error": str(exc)})
            self.failing = True
            return []
        self.failing = False
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
    emitted: set[tuple[int, str, tuple[str, ...]]] = field(default_factory=set)

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

    def ago(self, seconds: float) -> datetime:
        return self.wall - timedelta(seconds=seconds)

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
            )
        )

    def add_match(self, match: SignatureMatch, nodes: list[str], source: DetectionSource) -> None:
        kind, when = f"signature:{match.signature}", match.timestamp
        self.add(
            kind,
            source=source,
            nodes=nodes,
            text=match.text,
            fault_time=when,
            signature=match.signature,
        )
