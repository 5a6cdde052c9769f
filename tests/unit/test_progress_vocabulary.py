"""One progress vocabulary for every framework: the lines each prints when it steps, saves and
resumes, as the watcher's tracker, the evidence step and verify read them.

The lines are the frameworks' own (see the source file each pattern in
relaunch/detection/markers.py cites), with the ``srun -l`` labels a Slurm job's log carries.
"""

from __future__ import annotations

import time

import pytest

from relaunch.detection.progress import (
    CHECKPOINT_PATTERN,
    MAX_LINE,
    PROGRESS_PATTERN,
    RESUME_PATTERN,
    ProgressTracker,
    ResumeProgress,
    last_checkpoint,
    resumed_progress,
    vocabulary,
)

# (framework, progress line, its step, saved line, its step, resume line, its step)
FRAMEWORKS = [
    (
        "pytorch",
        "1: step=231 loss=0.4321 rank=1 node=n4",
        231,
        "0: checkpoint saved step=230 path=/ckpt/ckpt-latest.pt",
        230,
        "1: resumed from checkpoint step=230",
        230,
    ),
    (
        "megatron",
        "3:  [2026-02-02 12:15:29] iteration      231/  100000 | consumed samples:       29568 |"
        " elapsed time per iteration (ms): 812.3 | learning rate: 2.999999E-04 |",
        231,
        "0:   successfully saved checkpoint from iteration     230 to /ckpt/gpt [ t 1/1, p 1/1 ]",
        230,
        "0:   successfully loaded checkpoint from /ckpt/gpt [ t 1/2, p 1/1 ] at iteration 230",
        230,
    ),
    (
        "nemo",
        "0: Training epoch 0, iteration 231/99999 | lr: 3e-05 | global_batch_size: 128 |"
        " global_step: 231 | reduced_train_loss: 1.302 | train_step_timing in s: 0.2374",
        231,
        "0: [NeMo I 2025-06-18 16:53:08 nemo_logging:393] Successfully saved checkpoint from"
        " iteration     230 to /ckpt/llama--val_loss=1.62-step=230-consumed_samples=29568.0.ckpt",
        230,
        "0: Restored all states from the checkpoint at"
        " /ckpt/llama--val_loss=1.62-step=230-consumed_samples=29568.0.ckpt",
        230,
    ),
    (
        "lightning",
        "0: step=231 rank=0",  # what a Lightning job prints from its own callback
        231,
        "0: Epoch 3, global step 230: 'val_loss' reached 0.12000 (best 0.12000), saving model to"
        " '/ckpt/epoch=3-step=230.ckpt' as top 1",
        230,
        "0: Restored all states from the checkpoint at /ckpt/epoch=3-step=230.ckpt",
        230,
    ),
    (
        "deepspeed",
        "0: [2026-02-02 12:15:29,123] [INFO] [logging.py:128:log_dist] [Rank 0] step=231,"
        " skipped=0, lr=[0.0003], mom=[(0.9, 0.95)]",
        231,
        "0: [2026-02-02 12:15:29,123] [INFO] [torch_checkpoint_engine.py:33:commit] [Torch]"
        " Checkpoint global_step230 is ready now!",
        230,
        "1: [2026-02-02 12:15:29,123] [INFO] [torch_checkpoint_engine.py:27:load] [Torch] Loaded"
        " checkpoint from /ckpt/global_step230/mp_rank_00_model_states.pt.",
        230,
    ),
]
IDS = [f[0] for f in FRAMEWORKS]


@pytest.mark.parametrize(
    ("framework", "progress", "step", "saved", "saved_step", "resume", "resume_step"),
    FRAMEWORKS,
    ids=IDS,
)
def test_every_framework_s_lines_are_progress_saves_and_resumes(
    framework: str,
    progress: str,
    step: int,
    saved: str,
    saved_step: int,
    resume: str,
    resume_step: int,
) -> None:
    tracker = ProgressTracker()
    assert tracker.observe(progress, 1.0)
    assert tracker.max_step == step
    # Lightning prints no step line of its own: the job's callback prints the example's shape.
    assert tracker.framework == ("pytorch" if framework == "lightning" else framework)
    assert not tracker.observe(saved, 2.0)
    assert tracker.last_checkpoint_step == saved_step
    assert tracker.resumed_step is None  # nor a save a resume
    assert not tracker.observe(resume, 3.0)
    assert tracker.resumed_step == resume_step and tracker.ranks == {}
    # A save or resume line is never a step, nor a step line a checkpoint.
    assert last_checkpoint(f"{progress}\n{resume}\n") is None


@pytest.mark.parametrize(
    ("framework", "progress", "step", "saved", "saved_step", "resume", "resume_step"),
    FRAMEWORKS,
    ids=IDS,
)
def test_verify_reads_each_framework_s_resume_and_the_steps_past_it(
    framework: str,
    progress: str,
    step: int,
    saved: str,
    saved_step: int,
    resume: str,
    resume_step: int,
) -> None:
    log = "\n".join([saved, "0: Traceback (most recent call last):", resume, progress]) + "\n"
    found = resumed_progress(log)
    # The framework is the resume line's: NeMo resumes through Lightning's checkpoint connector.
    resumer = "lightning" if framework == "nemo" else framework
    assert found == ResumeProgress(step=resume_step, latest=step, framework=resumer)
    assert last_checkpoint(log) == saved_step


def test_megatron_s_resume_the_user_reported_is_confirmed() -> None:
    # What the user's job printed: the resume was never confirmed, verify said only RUNNING.
    log = "\n".join(
        [
            " [2026-02-02 12:10:00] iteration      229/  100000 | consumed samples: 29312 |",
            " [2026-02-02 12:10:01] iteration      230/  100000 | consumed samples: 29440 |",
            "  successfully saved checkpoint from iteration     230 to /ckpt/gpt",
            "srun: error: n2: task 1: Killed",
            " loading checkpoint from /ckpt/gpt at iteration 230",
            "  successfully loaded checkpoint from /ckpt/gpt [ t 1/1, p 1/1 ] at iteration 230",
            " [2026-02-02 12:13:00] iteration      231/  100000 | consumed samples: 29568 |",
            " [2026-02-02 12:13:01] iteration      232/  100000 | consumed samples: 29696 |",
            "iteration      233/  100000 | consumed samples: 29824 |",  # releases without a time
            " validation loss at iteration 233 | lm loss value: 2.1E+00 |",
        ]
    )
    assert last_checkpoint(log) == 230
    assert resumed_progress(log) == ResumeProgress(step=230, latest=233, framework="megatron")


def test_older_megatron_saves_say_at_iteration() -> None:
    assert last_checkpoint("  successfully saved checkpoint at iteration    1000 to /c\n") == 1000


def test_nemo_s_per_epoch_iteration_and_validation_are_not_megatron_steps() -> None:
    vocab = vocabulary()
    # NeMo's "iteration <n>" counts within the epoch: only its global_step is the step.
    nemo = "Training epoch 2, iteration 5/99 | lr: 3e-05 | global_step: 203 | loss: 1.2"
    assert (found := vocab.progress(nemo)) is not None and found.step == 203
    assert vocab.progress("Validation: iteration 1/20") is None
    assert vocab.progress(" validation loss at iteration 230 | lm loss value: 2.1E+00 |") is None


def test_lightning_s_resume_is_a_fit_s_restore_with_the_file_s_step() -> None:
    vocab = vocabulary()
    # Also printed before trainer.test(ckpt_path="best"): not a resume of training.
    assert vocab.resume("Restoring states from the checkpoint path at /c/step=9.ckpt") is None
    assert vocab.resume("Loaded model weights from the checkpoint at /c/step=9.ckpt") is None
    # Lightning before 2.0 said "checkpoint file at"; a directory's own step= is not the file's.
    old = "Restored all states from the checkpoint file at /runs/step=5/epoch=3-step=1200.ckpt"
    assert (found := vocab.resume(old)) is not None and found.step == 1200
    # A checkpoint named without a step names no step.
    assert vocab.resume("Restored all states from the checkpoint at /c/last.ckpt") is None


def test_deepspeed_s_save_counts_once_written_not_when_started() -> None:
    started = (
        "[2026-02-02 12:15:29,123] [INFO] [logging.py:128:log_dist] [Rank 0] Saving model"
        " checkpoint: /ckpt/global_step1200/mp_rank_00_model_states.pt"
    )
    written = (
        "[2026-02-02 12:15:31,456] [INFO] [torch_checkpoint_engine.py:23:save] [Torch] Saved"
        " /ckpt/global_step1200/mp_rank_00_model_states.pt."
    )
    assert last_checkpoint(started) is None
    assert last_checkpoint(f"{started}\n{written}\n") == 1200


def test_the_highest_saved_step_is_the_last_checkpoint() -> None:
    log = "0: checkpoint saved step=10 path=/c\n0: checkpoint saved step=30 path=/c\n"
    assert last_checkpoint(log + "0: checkpoint saved step=20 path=/c\n") == 30
    assert last_checkpoint("step=5 loss=1\n") is None
    assert last_checkpoint("") is None


def test_resumed_progress_takes_the_last_resume_and_steps_past_it() -> None:
    log = "\n".join(
        [
            "0: resumed from checkpoint step=50",
            "0: step=51 loss=0.1 rank=0 node=n1",
            "0: resumed from checkpoint step=80",
            "1: resumed from checkpoint step=80",
            "0: step=81 loss=0.1 rank=0 node=n3",
            "[rank1]: step=82 loss=0.1",  # torch's own prefix
            "1: [rank1]: step=80 loss=0.1",  # not past the resume
            "0: checkpoint saved step=90 path=/c",  # a save is not a step
        ]
    )
    assert resumed_progress(log) == ResumeProgress(step=80, latest=82, framework="pytorch")


def test_no_resume_or_no_step_past_it_is_none() -> None:
    assert resumed_progress("0: step=5 loss=1\n") is None
    assert resumed_progress("0: resumed from checkpoint step=80\n0: step=80 loss=1\n") is None
    # The words without a step are not a resume line.
    assert resumed_progress("resumed from checkpoint soon\n0: step=90 loss=1\n") is None
    # srun -l labels are not steps, nor are step= fields mid-line.
    assert resumed_progress("0: resumed from checkpoint step=80\n99: warming up step=99\n") is None


def test_the_job_s_own_pattern_is_added_to_the_frameworks() -> None:
    pattern = r"^it (?P<step>\d+) done"
    log = "resumed from checkpoint step=40\nit 41 done\nstep=42 loss=1\n"
    assert resumed_progress(log, pattern) == ResumeProgress(step=40, latest=42, framework="pytorch")
    assert resumed_progress("resumed from checkpoint step=40\nit 45 done\n", pattern) == (
        ResumeProgress(step=40, latest=45, framework="pytorch")
    )
    tracker = ProgressTracker(pattern)
    assert tracker.observe("0: it 41 done", 1.0) and tracker.framework == "custom"
    assert tracker.observe("0: step=42 loss=1", 2.0) and tracker.framework == "pytorch"
    # A group `step` that is not a number is no step.
    assert not ProgressTracker(r"it (?P<step>\w+)").observe("0: it x", 1.0)
    with pytest.raises(ValueError, match="step"):
        last_checkpoint("", r"iter=(\d+)")


HOSTILE = [
    "mlx5_core " * 16000 + "Segmentation fault",
    "successfully loaded checkpoint " * 5000,
    "loading checkpoint from " * 5000,
    "Restored all states from the checkpoint at " * 3000,
    "[Torch] Loaded checkpoint from " * 5000,
    "[Torch] Saved " * 10000,
    "global step 1: " * 10000 + "saving model to",
    "] iteration " * 10000,
    "iteration" + " " * 100_000 + "1",
    "| global_step: " * 10000,
    "[Rank 0] step=" * 10000,
    "checkpoint saved step=" * 10000,
]


@pytest.mark.parametrize("line", HOSTILE, ids=lambda line: repr(line[:24]))
def test_hostile_lines_cost_each_reader_milliseconds(line: str) -> None:
    text = "\n".join([line] * 4)
    started = time.process_time()
    assert last_checkpoint(text) is None
    assert resumed_progress(text) is None
    ProgressTracker().observe(line, 1.0)
    assert time.process_time() - started < 0.5


@pytest.mark.parametrize("regex", [CHECKPOINT_PATTERN, RESUME_PATTERN, PROGRESS_PATTERN])
def test_the_combined_patterns_stay_linear_on_uncut_lines(regex: object) -> None:
    import re

    assert isinstance(regex, re.Pattern)
    started = time.process_time()
    for line in HOSTILE:
        regex.search(line[: MAX_LINE * 8])
    assert time.process_time() - started < 0.5
