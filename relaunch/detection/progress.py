"""Training progress of one job attempt, per rank, from the job's own log: steps, stalls and
ranks left behind (``ProgressTracker``).

The lines it reads are the markers of ``relaunch.detection.markers`` (each framework's
progress, saved-checkpoint and resume lines); the marker names are re-exported here for the
modules that import them from this one. Time is whatever clock the caller passes as ``now``
(seconds, monotonic in production).
"""

from __future__ import annotations

import re
import statistics
from collections import deque
from dataclasses import dataclass

from relaunch.detection.markers import (
    CHECKPOINT_PATTERN,
    DEFAULT_PROGRESS_PATTERN,
    MAX_LINE,
    MEGATRON_PROGRESS_PATTERN,
    PROGRESS_PATTERN,
    RESUME_PATTERN,
    ResumeProgress,
    last_checkpoint,
    resumed_progress,
    split_rank,
    vocabulary,
)

__all__ = [
    # this module's own
    "DEFAULT_K",
    "MAX_RANKS",
    "PAUSE_MARGIN",
    "ProgressTracker",
    "RankProgress",
    # re-exported from relaunch.detection.markers, for the modules that import them from here
    "CHECKPOINT_PATTERN",
    "DEFAULT_PROGRESS_PATTERN",
    "MAX_LINE",
    "MEGATRON_PROGRESS_PATTERN",
    "PROGRESS_PATTERN",
    "RESUME_PATTERN",
    "ResumeProgress",
    "last_checkpoint",
    "resumed_progress",
    "vocabulary",
]

DEFAULT_K = 10.0
# A pause up to this many times the longest one already seen in the attempt is not a hang.
PAUSE_MARGIN = 1.5
# Ranks a tracker follows at most, whatever rank numbers a job prints (the job's task count
# when the caller knows it).
MAX_RANKS = 4096

_RANK_FIELD = re.compile(r"(?:^|\s)rank=(\d+)\b")
_NODE_FIELD = re.compile(r"(?:^|\s)node=([\w.-]+)")


@dataclass
class RankProgress:
    """The last step a rank reached, when it got there, and when it advanced before that."""

    step: int
    advanced_at: float
    previous_at: float | None = None


class ProgressTracker:
    """Per-rank progress of one job attempt, fed line by line.

    A rank is named by its ``srun -l`` label, else a leading ``[rank<r>]:``, else a
    ``rank=<r>`` field; lines with none of these count as one anonymous stream (rank None).
    A step counts as progress only when it is higher than the rank's last one; a resume marker
    starts a new attempt and forgets every rank's step (until they print again), the step
    intervals and the pauses seen. At most ``max_ranks`` ranks are followed (numbers from 0 to
    max_ranks - 1): a line naming another rank is counted in ``ignored_lines``, never kept.

    Two limits follow the job. A hang (:meth:`stall_limit`) waits out ``k`` step intervals and
    one and a half times the longest pause the attempt already came back from (an evaluation,
    a checkpoint save): a job is not called hung at the pause it makes every thousand steps.
    A lagging rank (:meth:`lag_limit`) gets no such allowance: its peers going on while it
    stops is not a pause.
    """

    def __init__(
        self,
        pattern: str | None = None,
        *,
        k: float = DEFAULT_K,
        window: int = 64,
        max_ranks: int = MAX_RANKS,
    ) -> None:
        self._vocabulary = vocabulary(pattern)
        self.k = k
        self._ranks: dict[int | None, RankProgress] = {}
        self._intervals: deque[float] = deque(maxlen=window)
        self._last_any: float | None = None
        self._longest_gap = 0.0
        self.rank_nodes: dict[int, str] = {}
        self.last_checkpoint_step: int | None = None
        self.resumed_step: int | None = None
        self.framework: str | None = None  # whose progress lines the job prints
        self.max_ranks = max(1, min(max_ranks, MAX_RANKS))
        self.ignored_lines = 0

    @property
    def ranks(self) -> dict[int | None, RankProgress]:
        return dict(self._ranks)

    @property
    def max_step(self) -> int | None:
        return max((r.step for r in self._ranks.values()), default=None)

    @property
    def longest_gap(self) -> float:
        """The longest time this attempt went without moving (a rank advancing or a
        checkpoint save finishing), between two moves (0 before the second)."""
        return self._longest_gap

    def observe(self, line: str, now: float) -> bool:
        """Take one log line; True when it moved some rank forward."""
        rank, body = split_rank(line[:MAX_LINE])
        resumed = self._vocabulary.resume(body)
        if resumed is not None:
            # A new attempt: step numbers start again from the checkpoint on every rank, and
            # its pace is learned afresh.
            self.resumed_step = resumed.step
            self._ranks.clear()
            self._intervals.clear()
            self._last_any, self._longest_gap = None, 0.0
            return False
        saved = self._vocabulary.saved(body)
        if saved is not None:
            self.last_checkpoint_step = max(self.last_checkpoint_step or 0, saved.step)
            # A finished save is the whole job moving: the pause before it ends here, so a
            # save followed by an evaluation counts as two pauses, not one long one (it only
            # ever holds a hang back: a printed line never makes one).
            self._active(now)
            return False
        found = self._vocabulary.progress(body)
        if found is None:
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
        previous = self._ranks.get(rank)
        if previous is not None and found.step <= previous.step:
            return False
        if previous is not None and now > previous.advanced_at:
            self._intervals.append(now - previous.advanced_at)
        self._active(now)
        self._ranks[rank] = RankProgress(
            step=found.step,
            advanced_at=now,
            previous_at=previous.advanced_at if previous is not None else None,
        )
        self.framework = found.framework
        return True

    def _active(self, now: float) -> None:
        """The job moved at ``now`` (a rank advanced, or a checkpoint save finished): the gap
        since it last moved is a pause it came back from."""
        if self._last_any is not None and now > self._last_any:
            self._longest_gap = max(self._longest_gap, now - self._last_any)
        self._last_any = now if self._last_any is None else max(self._last_any, now)

    @property
    def last_activity(self) -> float | None:
        """When the job last moved: a rank advanced or a checkpoint save finished (None
        before the first advance: a save alone says nothing of a job's progress lines)."""
        return self._last_any if self._ranks else None

    def median_interval(self) -> float | None:
        """The median time between a rank's consecutive advances, over recent advances."""
        return statistics.median(self._intervals) if self._intervals else None

    def lag_limit(self, floor_s: float) -> float:
        """How long one rank may go without advancing while others do: the floor ``floor_s``,
        or ``k`` times the usual step interval when steps are slow."""
        median = self.median_interval()
        return max(floor_s, self.k * median) if median is not None else floor_s

    def stall_limit(self, threshold_s: float) -> float:
        """How long the whole job may go without progress: :meth:`lag_limit`, or
        ``PAUSE_MARGIN`` times the longest pause this attempt already came back from."""
        return max(self.lag_limit(threshold_s), PAUSE_MARGIN * self._longest_gap)

    def stalled(self, now: float, threshold_s: float) -> bool:
        """The job did not move (:attr:`last_activity`) for longer than :meth:`stall_limit`.
        False before any progress: a job that never printed a marker cannot be judged."""
        last = self.last_activity
        return last is not None and now - last > self.stall_limit(threshold_s)

    def lagging_ranks(self, now: float, floor_s: float) -> list[int]:
        """Ranks that stopped advancing while others still do: the earliest sign of a dead
        node whose peers keep printing. A rank lags when its last advance is older than
        :meth:`lag_limit` and a peer advanced within it, twice since that rank's last advance:
        the first rank to print after a whole-job pause (a synchronous checkpoint save) has
        not left the others behind. Empty when everyone stalls (that is a hang)."""
        limit = self.lag_limit(floor_s)
        # The latest "advance before the last one" among ranks still advancing.
        going = max(
            (
                r.previous_at
                for r in self._ranks.values()
                if r.previous_at is not None and now - r.advanced_at <= limit
            ),
            default=None,
        )
        if going is None:
            return []
        return sorted(
            rank
            for rank, progress in self._ranks.items()
            if rank is not None
            and now - progress.advanced_at > limit
            and going > progress.advanced_at
        )
