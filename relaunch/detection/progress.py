"""Training progress from the job's own log: per-rank steps, checkpoints, resumes and stalls.

A progress marker is not a failure signature: it is the evidence that training moves. The
default marker is the example job's ``step=<N> loss=<x> rank=<r> node=<name>`` line; any regex
with a named group ``step`` can replace it (``MEGATRON_PROGRESS_PATTERN`` for Megatron logs).
Time is whatever clock the caller passes as ``now`` (seconds, monotonic in production).
"""

from __future__ import annotations

import re
import statistics
from collections import deque
from dataclasses import dataclass

DEFAULT_PROGRESS_PATTERN = r"^step=(?P<step>\d+)\b"
MEGATRON_PROGRESS_PATTERN = r"\] iteration\s+(?P<step>\d+)/"
# The example job's markers, then Megatron's.
CHECKPOINT_PATTERN = re.compile(
    r"checkpoint saved step=(?P<step>\d+)"
    r"|successfully saved checkpoint from iteration\s+(?P<it>\d+)"
)
# Bounded gaps: a line of repeated "successfully loaded checkpoint " must not cost a scan to
# its end per repetition.
RESUME_PATTERN = re.compile(
    r"resumed from checkpoint step=(?P<step>\d+)"
    r"|successfully loaded checkpoint .{0,1024}? at iteration[ \t]{1,64}(?P<it>\d+)"
)
# Both markers hold this: a line without it is never matched against them.
MARKER_LITERAL = "checkpoint"
DEFAULT_K = 10.0
# Ranks a tracker follows at most, whatever rank numbers a job prints (the job's task count
# when the caller knows it).
MAX_RANKS = 4096
# Characters of a line looked at (a marker is short; a hostile line may be megabytes).
MAX_LINE = 4096

_SRUN_LABEL = re.compile(r"^[ \t]*(?:P\d+ )?(\d+): ")
_TORCH_RANK = re.compile(r"^\[rank(\d+)\]: ?")
_RANK_FIELD = re.compile(r"(?:^|\s)rank=(\d+)\b")
_NODE_FIELD = re.compile(r"(?:^|\s)node=([\w.-]+)")


@dataclass
class RankProgress:
    """The last step a rank reached and when it got there."""

    step: int
    advanced_at: float


class ProgressTracker:
    """Per-rank progress of one job attempt, fed line by line.

    A rank is named by its ``srun -l`` label, else a leading ``[rank<r>]:``, else a
    ``rank=<r>`` field; lines with none of these count as one anonymous stream (rank None).
    A step counts as progress only when it is higher than the rank's last one; a resume marker
    starts a new attempt and forgets every rank's step (until they print again). At most
    ``max_ranks`` ranks are followed (numbers from 0 to max_ranks - 1): a line naming another
    rank is counted in ``ignored_lines``, never kept.
    """

    def __init__(
        self,
        pattern: str | None = None,
        *,
        k: float = DEFAULT_K,
        window: int = 64,
        max_ranks: int = MAX_RANKS,
    ) -> None:
        self._pattern = re.compile(pattern or DEFAULT_PROGRESS_PATTERN)
        if "step" not in self._pattern.groupindex:
            raise ValueError("a progress pattern needs a named group `step`")
        self.k = k
        self._ranks: dict[int | None, RankProgress] = {}
        self._intervals: deque[float] = deque(maxlen=window)
        self.rank_nodes: dict[int, str] = {}
        self.last_checkpoint_step: int | None = None
        self.resumed_step: int | None = None
        self.max_ranks = max(1, min(max_ranks, MAX_RANKS))
        self.ignored_lines = 0

    @property
    def ranks(self) -> dict[int | None, RankProgress]:
        return dict(self._ranks)

    @property
    def last_advance(self) -> float | None:
        """When any rank last advanced."""
        return max((r.advanced_at for r in self._ranks.values()), default=None)

    @property
    def max_step(self) -> int | None:
        return max((r.step for r in self._ranks.values()), default=None)

    def observe(self, line: str, now: float) -> bool:
        """Take one log line; True when it moved some rank forward."""
        rank, body = _split_rank(line[:MAX_LINE])
        if MARKER_LITERAL in body:
            resumed = RESUME_PATTERN.search(body)
            if resumed:
                # A new attempt: step numbers start again from the checkpoint on every rank.
                self.resumed_step = _step(resumed)
                self._ranks.clear()
                return False
            saved = CHECKPOINT_PATTERN.search(body)
            if saved:
                self.last_checkpoint_step = max(self.last_checkpoint_step or 0, _step(saved))
                return False
        found = self._pattern.search(body)
        if not found:
            return False
        if rank is None:
            field = _RANK_FIELD.search(body)
            rank = int(field.group(1)[:9]) if field else None
        if rank is not None and not 0 <= rank < self.max_ranks:
            self.ignored_lines += 1
            return False
        node = _NODE_FIELD.search(body)
        if node and rank is not None:
            self.rank_nodes[rank] = node.group(1)
        step = int(found.group("step")[:18])
        previous = self._ranks.get(rank)
        if previous is not None and step <= previous.step:
            return False
        if previous is not None and now > previous.advanced_at:
            self._intervals.append(now - previous.advanced_at)
        self._ranks[rank] = RankProgress(step=step, advanced_at=now)
        return True

    def median_interval(self) -> float | None:
        """The median time between a rank's consecutive advances, over recent advances."""
        return statistics.median(self._intervals) if self._intervals else None

    def stall_limit(self, threshold_s: float) -> float:
        """How long without progress counts as a stall: the floor ``threshold_s``, or ``k`` times
        the usual step interval when steps are slow."""
        median = self.median_interval()
        return max(threshold_s, self.k * median) if median is not None else threshold_s

    def stalled(self, now: float, threshold_s: float) -> bool:
        """No rank advanced for longer than :meth:`stall_limit`. False before any progress:
        a job that never printed a marker cannot be judged by this tracker."""
        last = self.last_advance
        return last is not None and now - last > self.stall_limit(threshold_s)

    def lagging_ranks(self, now: float, threshold_s: float) -> list[int]:
        """Ranks that stopped advancing while others still do: the earliest sign of a dead
        node whose peers keep printing. Empty when everyone stalls (that is a hang)."""
        limit = self.stall_limit(threshold_s)
        fresh = [r for r in self._ranks.values() if now - r.advanced_at <= limit]
        if not fresh:
            return []
        return sorted(
            rank
            for rank, progress in self._ranks.items()
            if rank is not None and now - progress.advanced_at > limit
        )

    @staticmethod
    def resumed_from(text: str) -> int | None:
        """The step of the last resume marker in ``text``, if any."""
        last: int | None = None
        for line in text.splitlines():
            if MARKER_LITERAL in line:
                found = RESUME_PATTERN.search(line[:MAX_LINE])
                last = _step(found) if found else last
        return last


def _split_rank(line: str) -> tuple[int | None, str]:
    """The rank the line's prefixes name (srun -l label first), and the line without them."""
    body = line.rstrip("\r\n")
    rank: int | None = None
    for prefix in (_SRUN_LABEL, _TORCH_RANK):
        found = prefix.match(body)
        if found:
            rank = int(found.group(1)[:9]) if rank is None else rank
            body = body[found.end() :]
    return rank, body


def _step(found: re.Match[str]) -> int:
    return int((found.group("step") or found.group("it"))[:18])
