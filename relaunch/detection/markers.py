"""The lines that show training moving: each framework's progress, saved-checkpoint and resume
markers, and the readers of a whole log built on them (``last_checkpoint``,
``resumed_progress``).

One vocabulary serves the watcher's tracker (``relaunch.detection.progress``), the evidence step
and verify: the lines each framework prints when it makes a step (progress), once a checkpoint is
written (saved) and when a restarted attempt loads one (resume). A marker is not a failure
signature: it is the evidence that training moves. The ``framework`` a marker reports:

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
when one of its plain texts is in the line, and every gap inside a pattern is bounded.
"""

from __future__ import annotations

import re
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

# Characters of a line looked at (a marker is short; a hostile line may be megabytes).
MAX_LINE = 4096

_SRUN_LABEL = re.compile(r"^[ \t]*(?:P\d+ )?(\d+): ")
_TORCH_RANK = re.compile(r"^\[rank(\d+)\]: ?")


class Vocabulary:
    """The markers of every framework, plus the job's own progress pattern (optional)."""

    def __init__(self, pattern: str | None = None) -> None:
        self.custom = re.compile(pattern) if pattern else None
        if self.custom is not None and "step" not in self.custom.groupindex:
            raise ValueError("a progress pattern needs a named group `step`")

    def resume(self, body: str) -> Mark | None:
        """The step a resume line names (the checkpoint a restarted attempt loads)."""
        return _RESUME.find(body)

    def saved(self, body: str) -> Mark | None:
        """The step a saved line names (a checkpoint written in full)."""
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
    steps = [saved.step for body in line_bodies(text) if (saved := vocab.saved(body))]
    return max(steps, default=None)


def last_progress(text: str, pattern: str | None = None) -> int | None:
    """The highest step a progress line in ``text`` names (saved and resume markers are not
    progress), if any."""
    vocab = vocabulary(pattern)
    steps = [
        mark.step
        for body in line_bodies(text)
        if vocab.resume(body) is None
        and vocab.saved(body) is None
        and (mark := vocab.progress(body)) is not None
    ]
    return max(steps, default=None)


def resumed_progress(text: str, pattern: str | None = None) -> ResumeProgress | None:
    """The last resume marker in ``text`` and the highest progress step printed after it that
    is past the resumed step; None without a resume marker or a step past it. Lines are read
    without their ``srun -l`` labels and ``[rank<r>]:`` prefixes."""
    vocab = vocabulary(pattern)
    resumed: Mark | None = None
    latest: int | None = None
    for body in line_bodies(text):
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


def line_bodies(text: str) -> Iterator[str]:
    """Each line of ``text``, cut at MAX_LINE, without its rank prefixes."""
    for line in text.splitlines():
        yield split_rank(line[:MAX_LINE])[1]


def split_rank(line: str) -> tuple[int | None, str]:
    """The rank the line's prefixes name (srun -l label first), and the line without them."""
    body = line.rstrip("\r\n")
    rank: int | None = None
    for prefix in (_SRUN_LABEL, _TORCH_RANK):
        found = prefix.match(body)
        if found:
            rank = int(found.group(1)[:9]) if rank is None else rank
            body = body[found.end() :]
    return rank, body
