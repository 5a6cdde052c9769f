"""Progress markers: per-rank steps, checkpoints, resumes, stalls and lagging ranks."""

from __future__ import annotations

import time

import pytest

from relaunch.detection.progress import MAX_RANKS, MEGATRON_PROGRESS_PATTERN, ProgressTracker


def feed(
    tracker: ProgressTracker, ranks: list[int], steps: range, start: float, every: float
) -> float:
    """Each rank prints each step, ``every`` seconds apart, with srun -l labels."""
    now = start
    for step in steps:
        for rank in ranks:
            tracker.observe(f"{rank}: step={step} loss=0.5 rank={rank} node=n{rank + 1}", now)
        now += every
    return now - every


def test_ranks_from_srun_labels_torch_prefixes_and_fields() -> None:
    tracker = ProgressTracker()
    assert tracker.observe("0: step=5 loss=1.0 rank=0 node=n1", 1.0)
    assert tracker.observe("[rank1]: step=5 loss=1.0", 1.0)
    assert tracker.observe("step=5 loss=1.0 rank=2 node=n3.cluster.local", 1.0)
    assert tracker.observe("3: [rank3]: step=5 loss=1.0", 1.0)
    assert set(tracker.ranks) == {0, 1, 2, 3}
    assert tracker.rank_nodes == {0: "n1", 2: "n3.cluster.local"}


def test_a_repeated_or_older_step_is_not_progress() -> None:
    tracker = ProgressTracker()
    assert tracker.observe("0: step=5 loss=1", 1.0)
    assert not tracker.observe("0: step=5 loss=1", 2.0)
    assert not tracker.observe("0: step=4 loss=1", 3.0)
    assert tracker.ranks[0].advanced_at == 1.0


def test_checkpoint_and_resume_are_not_progress() -> None:
    tracker = ProgressTracker()
    feed(tracker, [0, 1], range(1, 101), start=0.0, every=1.0)
    assert not tracker.observe("0: checkpoint saved step=100 path=/ckpt/step-100.pt", 101.0)
    assert tracker.last_checkpoint_step == 100
    # A requeued attempt resumes and counts again from the checkpoint.
    assert not tracker.observe("0: resumed from checkpoint step=100", 200.0)
    assert tracker.resumed_step == 100
    assert tracker.ranks == {}
    assert tracker.observe("0: step=101 loss=0.1 rank=0 node=n3", 201.0)
    assert tracker.max_step == 101


def test_the_last_resume_marker_counts() -> None:
    tracker = ProgressTracker()
    assert tracker.observe("step=1", 1.0)
    assert tracker.resumed_step is None
    for line in (
        "0: resumed from checkpoint step=50",
        "step=51",
        "0: resumed from checkpoint step=80",
    ):
        tracker.observe(line, 2.0)
    assert tracker.resumed_step == 80


def test_nothing_is_stalled_before_the_first_marker() -> None:
    tracker = ProgressTracker()
    assert not tracker.stalled(10_000.0, 120.0)
    assert tracker.lagging_ranks(10_000.0, 120.0) == []


def test_stall_uses_the_threshold_floor_for_fast_steps() -> None:
    tracker = ProgressTracker()
    last = feed(tracker, [0, 1], range(1, 30), start=0.0, every=1.0)
    assert tracker.median_interval() == 1.0
    assert not tracker.stalled(last + 119.0, 120.0)
    assert tracker.stalled(last + 121.0, 120.0)


def test_stall_waits_k_step_intervals_for_slow_steps() -> None:
    tracker = ProgressTracker(k=10)
    last = feed(tracker, [0], range(1, 10), start=0.0, every=60.0)
    assert tracker.stall_limit(120.0) == 600.0
    assert not tracker.stalled(last + 500.0, 120.0)
    assert tracker.stalled(last + 601.0, 120.0)


def test_lagging_ranks_are_those_left_behind() -> None:
    tracker = ProgressTracker()
    last = feed(tracker, [0, 1], range(1, 11), start=0.0, every=1.0)
    # Rank 1's node dies; rank 0 keeps printing.
    now = feed(tracker, [0], range(11, 200), start=last + 1.0, every=1.0)
    assert tracker.lagging_ranks(now, 120.0) == [1]
    assert not tracker.stalled(now, 120.0)
    # When every rank stops it is a hang, not a laggard.
    assert tracker.lagging_ranks(now + 500.0, 120.0) == []
    assert tracker.stalled(now + 500.0, 120.0)


def test_custom_pattern_needs_a_step_group() -> None:
    megatron = ProgressTracker(MEGATRON_PROGRESS_PATTERN)
    line = "0: [2026-02-02 12:15:29] iteration   589290/  993410 | consumed samples: 1000 |"
    assert megatron.observe(line, 1.0)
    assert megatron.max_step == 589290
    assert (
        megatron.observe("  successfully saved checkpoint from iteration    1000 to /c", 2) is False
    )
    assert megatron.last_checkpoint_step == 1000
    with pytest.raises(ValueError, match="step"):
        ProgressTracker(r"iter=(\d+)")


def test_the_default_marker_is_the_start_of_the_line() -> None:
    tracker = ProgressTracker()
    assert not tracker.observe("0: warming up, next step=5 soon", 1.0)
    assert tracker.ranks == {}


def test_rank_numbers_past_the_job_s_tasks_are_ignored_not_kept() -> None:
    tracker = ProgressTracker(max_ranks=4)
    for rank in range(100_000):  # a job printing a new "rank" on every line
        tracker.observe(f"step=1 loss=0.1 rank={rank} node=n{rank}", now=1.0)
    assert sorted(r for r in tracker.ranks if r is not None) == [0, 1, 2, 3]
    assert len(tracker.rank_nodes) == 4
    assert tracker.ignored_lines == 100_000 - 4


def test_the_hard_cap_bounds_a_tracker_that_does_not_know_the_task_count() -> None:
    tracker = ProgressTracker(max_ranks=10**9)
    assert tracker.max_ranks == MAX_RANKS
    tracker.observe(f"{MAX_RANKS}: step=1 loss=0.1", now=1.0)
    assert tracker.ranks == {} and tracker.ignored_lines == 1


def test_a_hostile_line_costs_progress_tracking_milliseconds() -> None:
    tracker = ProgressTracker(MEGATRON_PROGRESS_PATTERN)
    lines = [
        "mlx5_core " * 16000 + "Segmentation fault",
        "successfully loaded checkpoint " * 5000,
        "] iteration " * 10000,
        "checkpoint saved step=" * 10000,
    ]
    started = time.process_time()
    for line in lines:
        tracker.observe(line, now=1.0)
    assert time.process_time() - started < 0.5
    assert tracker.resumed_step is None and tracker.max_step is None


def test_a_pause_the_job_came_back_from_is_not_a_hang_next_time() -> None:
    tracker = ProgressTracker(k=10)
    last = feed(tracker, [0, 1], range(1, 50), start=0.0, every=1.0)
    assert tracker.longest_gap == 1.0 and tracker.stall_limit(20.0) == 20.0
    # A 30 s evaluation every 50 steps: the first one is past the 20 s floor...
    assert tracker.stalled(last + 21.0, 20.0)
    last = feed(tracker, [0, 1], range(50, 100), start=last + 30.0, every=1.0)
    # ... the next one is expected: up to 1.5 x the longest pause seen.
    assert tracker.longest_gap == 30.0
    assert tracker.stall_limit(20.0) == 45.0
    assert not tracker.stalled(last + 40.0, 20.0)
    assert tracker.stalled(last + 46.0, 20.0)


def test_a_synchronous_checkpoint_save_pauses_every_rank_and_none_lags() -> None:
    tracker = ProgressTracker(k=10)
    last = feed(tracker, [0, 1, 2], range(1, 101), start=0.0, every=1.0)
    # Every rank waits 200 s for rank 0's save: a whole-job pause, never a laggard.
    assert tracker.lagging_ranks(last + 150.0, 120.0) == []
    assert tracker.stalled(last + 150.0, 120.0)  # the first such pause is not known yet
    # Rank 0 prints first when the save is done; the others are a moment behind.
    back = last + 200.0
    assert tracker.observe("0: step=101 loss=0.5 rank=0 node=n1", back)
    assert tracker.lagging_ranks(back + 0.1, 120.0) == []
    feed(tracker, [1, 2], range(101, 102), start=back + 0.2, every=1.0)
    last = feed(tracker, [0, 1, 2], range(102, 150), start=back + 1.0, every=1.0)
    assert tracker.longest_gap == 200.0
    # The next save is expected (1.5 x 200 s); a rank stopping alone is not a pause.
    assert tracker.stall_limit(120.0) == 300.0 and tracker.lag_limit(120.0) == 120.0
    assert not tracker.stalled(last + 250.0, 120.0)
    now = feed(tracker, [0, 2], range(150, 300), start=last + 1.0, every=1.0)
    assert tracker.lagging_ranks(now, 120.0) == [1]
    assert not tracker.stalled(now, 120.0)


def test_a_lagging_rank_waits_the_floor_or_k_slow_steps() -> None:
    tracker = ProgressTracker(k=10)
    last = feed(tracker, [0, 1], range(1, 6), start=0.0, every=60.0)
    assert tracker.lag_limit(120.0) == 600.0
    now = feed(tracker, [0], range(6, 20), start=last + 60.0, every=60.0)
    stopped = tracker.ranks[1].advanced_at
    assert now - stopped > 600.0 and tracker.lagging_ranks(now, 120.0) == [1]
    assert tracker.lagging_ranks(stopped + 540.0, 120.0) == []
    # Fast steps: the floor.
    fast = ProgressTracker(k=10)
    last = feed(fast, [0, 1], range(1, 11), start=0.0, every=1.0)
    assert fast.lag_limit(120.0) == 120.0
    now = feed(fast, [0], range(11, 130), start=last + 1.0, every=1.0)
    assert fast.lagging_ranks(now, 120.0) == []  # 119 s behind
    now = feed(fast, [0], range(130, 135), start=now + 1.0, every=1.0)
    assert fast.lagging_ranks(now, 120.0) == [1]


def test_a_resume_forgets_the_pace_and_the_pauses() -> None:
    tracker = ProgressTracker(k=10)
    last = feed(tracker, [0, 1], range(1, 10), start=0.0, every=30.0)
    last = feed(tracker, [0, 1], range(10, 20), start=last + 500.0, every=30.0)
    assert tracker.stall_limit(120.0) == 750.0 and tracker.lag_limit(120.0) == 300.0
    tracker.observe("0: resumed from checkpoint step=19", last + 10.0)
    assert tracker.median_interval() is None and tracker.longest_gap == 0.0
    assert tracker.stall_limit(120.0) == 120.0 and tracker.lag_limit(120.0) == 120.0
    last = feed(tracker, [0, 1], range(20, 30), start=last + 20.0, every=1.0)
    assert tracker.stalled(last + 121.0, 120.0)


def test_a_checkpoint_save_then_an_evaluation_are_two_pauses_not_one_long_one() -> None:
    # Megatron and the example job save then evaluate at the same step when the intervals
    # coincide: 20 s of saving, then 30 s of evaluation, one 50 s gap between two steps. The
    # finished save ends the first pause, so neither exceeds a 45 s floor.
    tracker = ProgressTracker()
    now = 0.0
    for step in range(1, 21):
        now += 0.2
        tracker.observe(f"0: step={step} loss=0.5 rank=0", now)
        tracker.observe(f"1: step={step} loss=0.5 rank=1", now)
    saved_at = now + 20
    tracker.observe("0: checkpoint saved step=20 path=/ckpt", saved_at)
    assert not tracker.stalled(saved_at + 29.9, 45)  # 49.9 s after the last step
    assert tracker.stalled(saved_at + 45.1, 45)  # a real hang after the save is still seen
    tracker.observe("0: step=21 loss=0.5 rank=0", saved_at + 30)
    assert tracker.longest_gap == pytest.approx(30)


def test_a_save_before_any_progress_does_not_start_the_stall_clock() -> None:
    tracker = ProgressTracker()
    tracker.observe("0: checkpoint saved step=10 path=/ckpt", 0.0)
    assert tracker.last_activity is None and not tracker.stalled(1000.0, 45)
