"""Job logs read by need: a quiet log is looked at less often (up to ``log_quiet_max_s``), a
line appended to it is still found within that, a log that grows is read at every pass again,
and an ended job's log stops being read once read to the end (docs/detection.md).

The watcher against a fake scheduler (real Job models) and real log files; the passes' clock
is injected, so the pace is exact."""

from __future__ import annotations

import os
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from relaunch.connectors.logs import FileTail
from relaunch.models.recovery import Detection
from relaunch.models.scheduler import Job, JobState, Node, NodeState
from relaunch.workers.watcher import WatchConfig, Watcher

T0 = datetime(2026, 2, 20, 9, 0, 0, tzinfo=UTC)
PASS_S = 0.25  # log_interval_s: one log pass every quarter second, as the watcher runs
FAULT = "1: RuntimeError: CUDA error: uncorrectable ECC error encountered\n"


class FakeScheduler:
    def __init__(self, job: Job) -> None:
        self.jobs = [job]

    async def list_jobs(self) -> list[Job]:
        return [job.model_copy(deep=True) for job in self.jobs]

    async def list_nodes(self) -> list[Node]:
        return [Node(name=n, state=NodeState.ALLOCATED) for n in ("n1", "n2")]

    def set_job(self, **changes: object) -> None:
        self.jobs = [job.model_copy(update=changes) for job in self.jobs]


async def ignore(_: Detection) -> None:
    return None


@pytest.fixture
def log(tmp_path: Path) -> Path:
    path = tmp_path / "job-101.out"
    path.write_text("0: step=1 loss=1 rank=0 node=n1\n")
    return path


@pytest.fixture
def scheduler(log: Path) -> FakeScheduler:
    return FakeScheduler(
        Job(
            job_id="101",
            user_id=os.getuid(),
            group_id=os.getgid(),
            state=JobState.RUNNING,
            partition="debug",
            comment="relaunch=on",
            nodes=["n1", "n2"],
            num_tasks=2,
            stdout_path=str(log),
            stderr_path=str(log),
        )
    )


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """Every look at a file (FileTail.read: an open, its stats, a read when it grew)."""
    seen: list[str] = []
    real = FileTail.read

    def counted(self: FileTail) -> bytes:
        seen.append(self.path)
        return real(self)

    monkeypatch.setattr(FileTail, "read", counted)
    yield seen


def watcher_for(scheduler: FakeScheduler, **config: object) -> Watcher:
    settings: dict[str, object] = {"cluster": "dev", "log_interval_s": PASS_S}
    settings.update(config)
    return Watcher(WatchConfig.model_validate(settings), scheduler, ignore)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def passes(start: float, end: float) -> list[float]:
    """The log passes' times from ``start`` to ``end`` (inclusive), PASS_S apart."""
    count = round((end - start) / PASS_S)
    return [start + i * PASS_S for i in range(count + 1)]


def append(path: Path, text: str) -> None:
    with path.open("a") as f:
        f.write(text)


def file_ops(watcher: Watcher, op: str) -> float:
    value = watcher.metrics.registry.get_sample_value(
        "relaunch_watch_file_ops_total", {"cluster": "dev", "op": op}
    )
    return value or 0.0


async def test_a_quiet_log_is_read_less_often(
    scheduler: FakeScheduler, reads: list[str], log: Path
) -> None:
    """40 passes over 10 s of a log that does not grow: read at 0.25 s, 0.5 s, then once a
    second (about 13 looks, not 41), and the file operations counted say the same."""
    watcher = watcher_for(scheduler)
    await watcher.poll_once(at(0))
    assert reads == [str(log)]  # the first look reads it from the start
    for t in passes(PASS_S, 10.0):
        assert watcher.read_logs_once(at(t)) == []
    looks = len(reads)
    assert 10 <= looks <= 14, looks  # at least once a second, far fewer than the 41 passes
    # Each look: the checked open (two opens), two fstat; one pread, at the first look only,
    # with the stats of the file's directories when its access was first checked.
    directories = str(log).count("/")
    assert file_ops(watcher, "open") == 2 * looks
    assert file_ops(watcher, "stat") == 2 * looks + directories
    assert file_ops(watcher, "read") == 1


async def test_a_line_appended_to_a_quiet_log_is_found_within_the_cap(
    scheduler: FakeScheduler, log: Path
) -> None:
    """However the line falls between the sparse reads of a long-quiet log, it is found
    within log_quiet_max_s (1 s) and one pass."""
    for offset in (0.0, 0.1, 0.3, 0.55, 0.8, 0.95):
        append(log, "0: step=2 loss=1 rank=0 node=n1\n")
        watcher = watcher_for(scheduler)
        await watcher.poll_once(at(0))
        for t in passes(PASS_S, 30.0):  # quiet for 30 s: backed off to the cap
            assert watcher.read_logs_once(at(t)) == []
        written = 30.0 + offset
        append(log, FAULT)
        found_at = None
        for t in passes(30.0 + PASS_S, 33.0):
            if t < written:
                continue
            if watcher.read_logs_once(at(t)):
                found_at = t
                break
        assert found_at is not None, offset
        assert found_at - written <= 1.0 + PASS_S, (offset, found_at - written)
        log.write_text("0: step=1 loss=1 rank=0 node=n1\n")  # the next round starts afresh


async def test_a_log_that_grows_again_is_read_at_every_pass(
    scheduler: FakeScheduler, reads: list[str], log: Path
) -> None:
    """A quiet log backs off; once it grows it is read at every pass again (training progress
    a line a pass: every line read in the pass after it was written)."""
    watcher = watcher_for(scheduler)
    await watcher.poll_once(at(0))
    for t in passes(PASS_S, 10.0):
        watcher.read_logs_once(at(t))
    quiet_looks = len(reads)
    assert quiet_looks <= 14
    append(log, "0: step=2 loss=1 rank=0 node=n1\n")
    for t in passes(10.0 + PASS_S, 11.0):  # the growth is seen within a second
        watcher.read_logs_once(at(t))
    seen_at = len(reads)
    assert seen_at > quiet_looks
    del reads[:]
    growing = passes(11.0 + PASS_S, 16.0)
    for step, t in enumerate(growing, start=3):
        append(log, f"0: step={step} loss=1 rank=0 node=n1\n")
        watcher.read_logs_once(at(t))
    assert len(reads) == len(growing)  # every pass
    progress = watcher._jobs["101"].progress
    assert progress.max_step == 2 + len(growing)  # each line read in its own pass


async def test_an_ended_job_is_read_to_the_end_then_no_more(
    scheduler: FakeScheduler, reads: list[str], log: Path
) -> None:
    """A job that failed: its last lines are still read (here a fault written as it ended),
    then its log is no longer looked at while it stays listed; requeued and running again,
    it is read again from where it was."""
    watcher = watcher_for(scheduler)
    await watcher.poll_once(at(0))
    append(log, FAULT)
    scheduler.set_job(state=JobState.FAILED, end_time=at(1))
    found = await watcher.poll_once(at(1))
    assert "signature:cuda_ecc" in [d.kind for d in found]  # the last line, read as it ended
    for t in passes(1.0 + PASS_S, 5.0):  # the grace for late lines, then done
        watcher.read_logs_once(at(t))
    await watcher.poll_once(at(5))
    del reads[:]
    for second in range(6, 60):  # listed for a while after it ended (MinJobAge)
        await watcher.poll_once(at(second))
        for t in passes(second + PASS_S, second + 0.75):
            watcher.read_logs_once(at(t))
    assert reads == []  # no look at all, in 54 polls and 162 log passes
    # Requeued and running again: read again from where it stopped.
    scheduler.set_job(state=JobState.RUNNING, restart_count=1, end_time=None)
    await watcher.poll_once(at(60))
    append(log, FAULT.replace("1: ", "0: "))
    found = watcher.read_logs_once(at(60.25))
    assert [(d.kind, d.attempt) for d in found] == [("signature:cuda_ecc", 1)]
