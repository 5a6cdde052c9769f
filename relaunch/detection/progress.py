"""Training progress from the job's own log: per-rank steps, checkpoints, resumes and stalls.

One vocabulary serves the watcher's tracker, the evidence step and verify: the lines each
framework prints when it makes a step (progress), once a checkpoint is written (saved) and when
a restarted attempt loads one (resume). A marker is not a failure signature: it is the evidence
that training moves. The ``framework`` a marker reports:

- ``pytorch``: the example job (examples/train_ddp.py): ``step=<N> ...``,
  ``checkpoint saved step=<N>``, ``resumed from checkpoint step=<N>``.
- ``megatron``: Megatron-LM, and NeMo's Megatron checkpoint IO (which capitalises
  ``Successfully``): `` iteration <N>/<total> |``, ``successfully saved checkpoint from
  iteration <N>``, `` loading checkpoint from <dir> at iteration <N>``, ``successfully loaded
  checkpoint from <dir> [ t 1/1, p 1/1 ] at iteration <N>``.
- ``nemo``: NeMo 2's ``ProgressPrinter`` (``Training epoch 0, iteration 64/99 | ... |
  global_step: 64 | ...``); its checkpoints are Megatron's or Lightning's lines.
- ``lightning``: PyTorch Lightning's ``ModelCheckpoint(verbose=True)`` save line and the
  ``Restored all states`` line of a resumed ``fit`` (the step is the ``step=<N>`` of the
  default checkpoint file name ``epoch=<E>-step=<N>.ckpt``).
- ``deepspeed``: ``[Rank 0] step=<N>, skipped=...`` (every ``steps_per_print`` steps) and its
  torch checkpoint engine's ``[Torch] ...`` lines on the ``global_step<N>`` tag.
- ``custom``: the job's own progress pattern (config ``watch.progress_pattern``, a regex with
  a named group ``step``), tried before the others, never instead of them.

Lightning prints no line that carries the global step: its progress bar shows the batch index
within the epoch, rewritten in place with carriage returns, and its loggers write to files. A
Lightning job that wants hang and lagging-rank detection prints one line per step in the example
job's shape, e.g. from a callback's ``on_train_batch_end``::

    print(f"step={trainer.global_step} rank={trainer.global_rank}", flush=True)

or sets ``watch.progress_pattern`` to a line it already prints. Megatron, NeMo's printer and
DeepSpeed print progress from one rank only: they give hang detection, not lagging ranks.

A saved marker is a line printed once the checkpoint is written, never one printed before the
write (DeepSpeed's ``Saving model checkpoint: <path>``): a save the fault cut short must not be
taken for one the restart can resume from. Lightning's only save line is printed just before
its write; it is kept because Lightning prints nothing after it.

Matching stays linear on hostile lines: a line is cut at ``MAX_LINE``, each pattern runs only
when one of its plain texts is in the line, and every gap inside a pattern is bounded. Time is
whatever clock the caller passes as ``now`` (seconds, monotonic in production).
"""

from __future__ import annotations

import re
import statistics
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from functools import lru_cache

PYTORCH, MEGATRON, NEMO, LIGHTNING, DEEPSPEED, CUSTOM = (
    "pytorch",
    "megatron",
    "nemo",
    "lightning",
    "deepspeed",
    "custom",
)


@dataclass(frozen=True)
class Marker:
    """One line shape a framework prints: a plain text every such line holds (looked for before
    the regex runs) and a regex whose named group ``step`` is the step the line names."""

    framework: str
    literal: str
    regex: str


# examples/train_ddp.py (Printer.progress): the example job's line, at the start of the line.
DEFAULT_PROGRESS_PATTERN = r"^step=(?P<step>\d+)\b"
# megatron/training/training.py (training_log): " [<time>] iteration <N>/<total> |", the time
# only in recent versions. Not NeMo's "Training epoch 0, iteration <n>/<total>": that <n>
# counts within the epoch. Nor "Validation: iteration <n>/<total>".
MEGATRON_PROGRESS_PATTERN = r"(?:^[ \t]{0,16}|\] )iteration[ \t]{1,64}(?P<step>\d{1,18})/"

PROGRESS_MARKERS = (
    Marker(PYTORCH, "step=", DEFAULT_PROGRESS_PATTERN),
    Marker(MEGATRON, "iteration", MEGATRON_PROGRESS_PATTERN),
    # nemo/lightning/pytorch/callbacks/progress_printer.py (ProgressPrinter.on_train_batch_end)
    Marker(NEMO, "| global_step: ", r"\| global_step: (?P<step>\d{1,18})\b"),
    # deepspeed/runtime/engine.py (_report_progress); deepspeed/utils/logging.py (log_dist)
    # puts "[Rank 0] " before it, after the logger's own "[<time>] [INFO] [...]".
    Marker(DEEPSPEED, "] step=", r"\[Rank \d{1,9}\] step=(?P<step>\d{1,18}), skipped="),
)
SAVED_MARKERS = (
    # examples/train_ddp.py (Printer.saved)
    Marker(PYTORCH, "checkpoint saved step=", r"checkpoint saved step=(?P<step>\d{1,18})"),
    # megatron/training/checkpointing.py (save_checkpoint): "from iteration", "at iteration"
    # in older releases. nemo/lightning/io/pl.py (MegatronCheckpointIO.save_checkpoint) logs
    # it with a capital S once an asynchronous save is finalized; a synchronous NeMo save says
    # only "Global Checkpoint Save : ... Iteration: <N>", which an asynchronous one prints
    # when it is merely scheduled, so that line is not a saved marker.
    Marker(
        MEGATRON,
        "uccessfully saved checkpoint ",
        r"[Ss]uccessfully saved checkpoint (?:from|at) iteration[ \t]{1,64}(?P<step>\d{1,18})",
    ),
    # lightning/pytorch/callbacks/model_checkpoint.py (_update_best_and_save, verbose=True):
    # "Epoch 3, global step 1200: 'val_loss' reached 0.12 (best 0.12), saving model to '...'".
    Marker(
        LIGHTNING,
        "saving model to ",
        r"global step (?P<step>\d{1,18}): [^\n]{0,512}?saving model to ",
    ),
    # deepspeed/runtime/checkpoint_engine/torch_checkpoint_engine.py (commit, after every
    # file of the tag is written; the tag is "global_step<N>" unless the job names its own).
    Marker(
        DEEPSPEED,
        "is ready now!",
        r"\[Torch\] Checkpoint global_step(?P<step>\d{1,18}) is ready now!",
    ),
    # ... and (save) "[Torch] Saved <dir>/global_step<N>/<file>.", for releases whose
    # commit is silent.
    Marker(
        DEEPSPEED,
        "[Torch] Saved ",
        r"\[Torch\] Saved [^\n]{0,1024}?\bglobal_step(?P<step>\d{1,18})/",
    ),
)
RESUME_MARKERS = (
    # examples/train_ddp.py (Printer.resumed)
    Marker(
        PYTORCH, "resumed from checkpoint step=", r"resumed from checkpoint step=(?P<step>\d{1,18})"
    ),
    # megatron/training/checkpointing.py (load_checkpoint): "  successfully loaded checkpoint
    # from <dir> [ t 1/1, p 1/1 ] at iteration <N>" after " loading checkpoint from <dir> at
    # iteration <N>". Bounded gaps: a line of repeated "successfully loaded checkpoint " must
    # not cost a scan to its end per repetition.
    Marker(
        MEGATRON,
        "uccessfully loaded checkpoint ",
        r"[Ss]uccessfully loaded checkpoint [^\n]{0,1024}? at iteration[ \t]{1,64}"
        r"(?P<step>\d{1,18})",
    ),
    Marker(
        MEGATRON,
        "loading checkpoint from ",
        r"loading checkpoint from [^\n]{0,1024}? at iteration[ \t]{1,64}(?P<step>\d{1,18})",
    ),
    # lightning/pytorch/trainer/connectors/checkpoint_connector.py (resume_end): printed for
    # fit only ("Loaded model weights" for validate and test); "checkpoint file at" before
    # Lightning 2.0. The last "step=<N>" of the path: the file's, not a directory's.
    Marker(
        LIGHTNING,
        "Restored all states from the checkpoint ",
        r"Restored all states from the checkpoint (?:file )?at [^\n]{0,1024}\bstep="
        r"(?P<step>\d{1,18})",
    ),
    # deepspeed/runtime/checkpoint_engine/torch_checkpoint_engine.py (load)
    Marker(
        DEEPSPEED,
        "[Torch] Loaded checkpoint from ",
        r"\[Torch\] Loaded checkpoint from [^\n]{0,1024}?\bglobal_step(?P<step>\d{1,18})/",
    ),
)


@dataclass(frozen=True)
class Mark:
    """A step a line names, and the framework whose line it is."""

    step: int
    framework: str


class _Kind:
    """Every marker of one kind as one regex (an alternative per marker, its step group named
    after it) and the plain texts that admit a line to it."""

    def __init__(self, markers: tuple[Marker, ...], tag: str) -> None:
        self.markers = {f"{tag}{i}": m for i, m in enumerate(markers)}
        self.pattern = re.compile(
            "|".join(
                "(?:" + m.regex.replace("(?P<step>", f"(?P<{name}>") + ")"
                for name, m in self.markers.items()
            )
        )
        self.literals = tuple(dict.fromkeys(m.literal for m in markers))

    def find(self, body: str) -> Mark | None:
        if not any(literal in body for literal in self.literals):
            return None
        found = self.pattern.search(body)
        if found is None or found.lastgroup is None:
            return None
        return Mark(int(found.group(found.lastgroup)[:18]), self.markers[found.lastgroup].framework)


_PROGRESS = _Kind(PROGRESS_MARKERS, "progress")
_SAVED = _Kind(SAVED_MARKERS, "saved")
_RESUME = _Kind(RESUME_MARKERS, "resume")
# Every framework's markers of a kind as one regex (the names other modules and tests use).
CHECKPOINT_PATTERN = _SAVED.pattern
RESUME_PATTERN = _RESUME.pattern
PROGRESS_PATTERN = _PROGRESS.pattern

DEFAULT_K = 10.0
# A pause up to this many times the longest one already seen in the attempt is not a hang.
PAUSE_MARGIN = 1.5
# Ranks a tracker follows at most, whatever rank numbers a job prints (the job's task count
# when the caller knows it).
MAX_RANKS = 4096
# Characters of a line looked at (a marker is short; a hostile line may be megabytes).
MAX_LINE = 4096

_SRUN_LABEL = re.compile(r"^[ \t]*(?:P\d+ )?(\d+): ")
_TORCH_RANK = re.compile(r"^\[rank(\d+)\]: ?")
_RANK_FIELD = re.compile(r"(?:^|\s)rank=(\d+)\b")
_NODE_FIELD = re.compile(r"(?:^|\s)node=([\w.-]+)")


class Vocabulary:
    """The markers of every framework, plus the job's own progress pattern (optional)."""

    def __init__(self, pattern: str | None = None) -> None:
        self.custom = re.compile(pattern) if pattern else None
        if self.custom is not None and "step" not in self.custom.groupindex:
            raise ValueError("a progress pattern needs a named group `step`")

    def resume(self, body: str) -> Mark | None:
        return _RESUME.find(body)

    def saved(self, body: str) -> Mark | None:
        return _SAVED.find(body)

    def progress(self, body: str) -> Mark | None:
        """The step a progress line names: the job's own pattern first, then the frameworks'.
        A line that is a resume or saved marker is the caller's to rule out first."""
        if self.custom is not None:
            found = self.custom.search(body)
            step = found.group("step") if found else None
            if step and step.isascii() and step.isdigit():
                return Mark(int(step[:18]), CUSTOM)
        return _PROGRESS.find(body)


@lru_cache(maxsize=16)
def vocabulary(pattern: str | None = None) -> Vocabulary:
    """The vocabulary for a job's progress pattern (compiled once per pattern)."""
    return Vocabulary(pattern)


@dataclass(frozen=True)
class ResumeProgress:
    """A restarted attempt's resume and how far it got past it."""

    step: int  # the step of the checkpoint it resumed from
    latest: int  # the highest step printed after the resume
    framework: str  # whose resume line it was


def last_checkpoint(text: str, pattern: str | None = None) -> int | None:
    """The highest step a saved marker in ``text`` names, if any. ``pattern`` (the job's
    progress pattern) names no checkpoint; it is checked and taken so that every reader of the
    log is called with the same configuration."""
    vocab = vocabulary(pattern)
    steps = [saved.step for body in _bodies(text) if (saved := vocab.saved(body))]
    return max(steps, default=None)


def resumed_progress(text: str, pattern: str | None = None) -> ResumeProgress | None:
    """The last resume marker in ``text`` and the highest progress step printed after it that
    is past the resumed step; None without a resume marker or a step past it. Lines are read
    without their ``srun -l`` labels and ``[rank<r>]:`` prefixes."""
    vocab = vocabulary(pattern)
    resumed: Mark | None = None
    latest: int | None = None
    for body in _bodies(text):
        mark = vocab.resume(body)
        if mark is not None:
            resumed, latest = mark, None
            continue
        if resumed is None or vocab.saved(body) is not None:
            continue
        step = vocab.progress(body)
        if step is not None and step.step > resumed.step:
            latest = max(latest or 0, step.step)
    if resumed is None or latest is None:
        return None
    return ResumeProgress(step=resumed.step, latest=latest, framework=resumed.framework)


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
    def last_advance(self) -> float | None:
        """When any rank last advanced."""
        return max((r.advanced_at for r in self._ranks.values()), default=None)

    @property
    def max_step(self) -> int | None:
        return max((r.step for r in self._ranks.values()), default=None)

    @property
    def longest_gap(self) -> float:
        """The longest time this attempt went without any rank advancing, between two
        advances (0 before the second)."""
        return self._longest_gap

    def observe(self, line: str, now: float) -> bool:
        """Take one log line; True when it moved some rank forward."""
        rank, body = _split_rank(line[:MAX_LINE])
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
        if self._last_any is not None and now > self._last_any:
            self._longest_gap = max(self._longest_gap, now - self._last_any)
        self._last_any = now if self._last_any is None else max(self._last_any, now)
        self._ranks[rank] = RankProgress(
            step=found.step,
            advanced_at=now,
            previous_at=previous.advanced_at if previous is not None else None,
        )
        self.framework = found.framework
        return True

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
        """No rank advanced for longer than :meth:`stall_limit`. False before any progress:
        a job that never printed a marker cannot be judged by this tracker."""
        last = self.last_advance
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

    @staticmethod
    def resumed_from(text: str) -> int | None:
        """The step of the last resume marker in ``text``, if any."""
        last: int | None = None
        for body in _bodies(text):
            found = _RESUME.find(body)
            last = found.step if found else last
        return last


def _bodies(text: str) -> Iterator[str]:
    """Each line of ``text``, cut at MAX_LINE, without its rank prefixes."""
    for line in text.splitlines():
        yield _split_rank(line[:MAX_LINE])[1]


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
