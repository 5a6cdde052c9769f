"""Straggler rules on lines in PyTorch's watchdog format (failure-signatures.md §2.1)."""

from __future__ import annotations

from relaunch.detection.straggler import find_stragglers


def timeout(rank: int, seq: int) -> str:
    return (
        f"{rank}: [rank{rank}]:[E202 12:25:57.436 ProcessGroupNCCL.cpp:697] [Rank {rank}] "
        f"Watchdog caught collective operation timeout: WorkNCCL(SeqNum={seq}, OpType=ALLREDUCE, "
        "NumelIn=10, NumelOut=20, Timeout(ms)=600000) ran for 600000 milliseconds "
        "before timing out."
    )


def test_the_rank_with_the_lower_sequence_number_lags() -> None:
    report = find_stragglers([timeout(0, 4521), timeout(1, 4520), timeout(2, 4521)])
    assert report.lagging == [1] and report.ranks == [1]
    assert "SeqNum 4520" in report.reason


def test_the_rank_that_never_reports_is_the_straggler() -> None:
    progress = [f"{r}: step=9 loss=0.1 rank={r}" for r in range(8)]
    lines = progress + [timeout(r, 77) for r in range(8) if r != 5]
    report = find_stragglers(lines)
    assert report.silent == [5] and report.ranks == [5]


def test_silence_of_many_ranks_names_nobody() -> None:
    progress = [f"{r}: step=9 loss=0.1 rank={r}" for r in range(8)]
    report = find_stragglers(progress + [timeout(0, 77), timeout(1, 77)])
    assert report.ranks == []


def test_a_slow_rank_by_its_own_step_times() -> None:
    lines = [
        f"{r}: step={i} loss=0.1 rank={r} step_time={3.1 if r == 2 else 1.0}s"
        for i in range(5)
        for r in range(4)
    ]
    report = find_stragglers(lines)
    assert report.slow == [2] and report.ranks == [2]
    assert find_stragglers(lines[:8]).slow == [2]


def test_nothing_to_say_without_timeouts_or_timings() -> None:
    assert find_stragglers(["0: step=1 loss=0.3 rank=0"]).ranks == []


def test_the_straggler_rules_see_timeouts_anywhere_in_a_big_log() -> None:
    # Attribution hands the rules a bounded choice of lines (the head, the last 4 MiB and every
    # collective timeout), not the whole log: timeouts buried under later noise still count.
    from datetime import UTC, datetime

    from relaunch.detection.findings import STRAGGLER_TAIL, collect
    from relaunch.detection.signatures import Catalogue
    from relaunch.models.bundle import Bundle, BundleJob

    head = "".join(f"{r}: step=1 loss=0.1 rank={r}\n" for r in range(4))
    timeouts = "".join(timeout(r, 77 if r != 2 else 76) + "\n" for r in range(4))
    noise = "0: gpu1:1:1 [0] NCCL INFO Channel 00/32 : 0[0] -> 1[1] via NET/IB/0\n"
    log = head + noise * 50_000 + timeouts + noise * (2 * STRAGGLER_TAIL // len(noise))
    job = BundleJob(
        cluster="c", job_id="1", state="RUNNING", nodes=["n1"], observed_at=datetime.now(UTC)
    )
    found = collect(Bundle(path="m", job=job, job_log=log), Catalogue.load())
    assert len(found.job_lines) < 100_000 < log.count("\n")
    assert find_stragglers(found.job_lines).lagging == [2]
