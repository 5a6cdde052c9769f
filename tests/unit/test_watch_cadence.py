"""How often the watcher lists jobs and nodes (relaunch/workers/watch_cadence.py): a cost that
follows what the listing costs and what happens, while logs are still read at their own pace."""

from __future__ import annotations

import asyncio
import os
import time
from collections import Counter
from pathlib import Path

import pytest

from relaunch.models.config import WatchSettings
from relaunch.models.recovery import Detection
from relaunch.models.scheduler import Job, JobState, Node, NodeState
from relaunch.workers.watch_cadence import Cadence, CadenceSettings
from relaunch.workers.watcher import WatchConfig, Watcher


def test_a_costly_listing_comes_rarely_and_more_often_while_busy() -> None:
    assert CadenceSettings().listing_share == 0.02  # the default: 0.7 s every 30 s
    # share 0.05, busy 0.25, 1-30 s, nodes every 5 s
    cadence = Cadence(CadenceSettings(listing_share=0.05))
    cadence.jobs_listed(began=100.0, took=0.7)  # 10,000 jobs: squeue takes 0.7 s
    assert cadence.job_interval(101.0) == pytest.approx(14.0)
    assert cadence.jobs_in(101.0) == pytest.approx(13.0)
    cadence.stir(101.0)  # a detection: recoveries run, follow them closely for a minute
    assert cadence.job_interval(101.0) == pytest.approx(2.8)
    assert cadence.job_interval(161.5) == pytest.approx(14.0)  # and back down after
    cadence.jobs_listed(began=200.0, took=0.01)  # 100 jobs: every poll_interval_s
    assert cadence.job_interval(200.0) == 1.0
    cadence.jobs_listed(began=300.0, took=9.0)  # 100,000 jobs: at least every reconcile_s
    assert cadence.job_interval(300.0) == 30.0
    # The active jobs: every active_interval_s (2 s) between full listings, every poll while
    # busy.
    assert cadence.active_in(301.0) == pytest.approx(1.0)
    cadence.active_listed(302.0)
    assert cadence.active_in(303.0) == pytest.approx(1.0)
    cadence.stir(303.0)
    assert cadence.active_in(303.0) == pytest.approx(0.0)
    # Nodes: every node_interval_s (5 s), every poll while busy or while a recovery waits to
    # see its node drained.
    cadence = Cadence(CadenceSettings())
    cadence.nodes_listed(300.0)
    assert cadence.nodes_in(301.0, urgent=False) == pytest.approx(4.0)
    assert cadence.nodes_in(301.0, urgent=True) == pytest.approx(0.0)
    cadence.nodes_listed(303.0)
    assert cadence.nodes_in(304.0, urgent=False) == pytest.approx(4.0)


def test_the_paces_are_checked_against_each_other() -> None:
    with pytest.raises(ValueError, match="reconcile_s"):
        WatchSettings(poll_interval_s=10, reconcile_s=5)
    with pytest.raises(ValueError, match="catch_up_gap_s"):
        WatchSettings(reconcile_s=90, catch_up_gap_s=60)
    assert WatchSettings(poll_interval_s=30).poll_interval_s == 30  # no longer capped at 2 s


class SlowScheduler:
    """A controller whose job listing takes ``listing_s`` (a queue of thousands of jobs)."""

    def __init__(self, log: Path, listing_s: float) -> None:
        self.listing_s = listing_s
        self.calls: Counter[str] = Counter()
        self.state = JobState.RUNNING
        self.log = log

    async def list_jobs(self) -> list[Job]:
        self.calls["list_jobs"] += 1
        await asyncio.sleep(self.listing_s)
        return [self.job()]

    def job(self) -> Job:
        return Job(
            job_id="7",
            user_id=os.getuid(),
            group_id=os.getgid(),
            state=self.state,
            comment="relaunch=on",
            nodes=["n1"],
            num_tasks=1,
            stdout_path=str(self.log),
            stderr_path=str(self.log),
        )

    async def list_nodes(self) -> list[Node]:
        self.calls["list_nodes"] += 1
        return [Node(name="n1", state=NodeState.ALLOCATED)]


async def _until(check: object, timeout: float) -> float:
    began = time.monotonic()
    while time.monotonic() - began < timeout:
        if check():  # type: ignore[operator]
            return time.monotonic() - began
        await asyncio.sleep(0.01)
    raise AssertionError(f"not within {timeout}s")


async def test_a_slow_listing_is_not_repeated_every_poll_and_logs_are_still_read(
    tmp_path: Path,
) -> None:
    """A listing that takes 0.1 s runs every 2 s (at 5 %), not every 0.2 s poll interval; the
    nodes come every node_interval_s between; a log line is still found within a log
    interval; and the detection makes the listings come often while its recovery runs."""
    log = tmp_path / "job-7.out"
    log.write_text("")
    sched = SlowScheduler(log, listing_s=0.1)
    delivered: list[Detection] = []

    async def deliver(det: Detection) -> None:
        delivered.append(det)

    config = WatchConfig(
        cluster="dev",
        poll_interval_s=0.2,
        log_interval_s=0.05,
        node_interval_s=0.5,
        busy_s=30,
        log_quiet_max_s=0.1,
        listing_share=0.05,
    )
    watcher = Watcher(config, sched, deliver)
    stop = asyncio.Event()
    running = asyncio.create_task(watcher.run(stop))
    try:
        await asyncio.sleep(1.6)
        # Before this change: a listing every 0.2 s (7 or 8 in 1.6 s).
        assert sched.calls["list_jobs"] == 1, sched.calls
        assert 2 <= sched.calls["list_nodes"] <= 5, sched.calls  # 1 with the jobs, ~3 between
        with log.open("a") as out:
            out.write("0: RuntimeError: CUDA error: uncorrectable ECC error encountered\n")
        took = await _until(lambda: delivered, timeout=2.0)
        assert took < 0.5 and delivered[0].kind == "signature:cuda_ecc"
        # Busy now: share 0.25, so a 0.1 s listing every 0.4 s; the job's end seen quickly.
        before = sched.calls["list_jobs"]
        sched.state = JobState.FAILED
        await _until(lambda: any(d.kind == "job_state:FAILED" for d in delivered), timeout=1.5)
        await asyncio.sleep(1.5)  # ~0.4 s apart (2 s apart when not busy: at most 1)
        assert sched.calls["list_jobs"] - before >= 2, sched.calls
    finally:
        stop.set()
        await asyncio.wait_for(running, timeout=10)


class QueueScheduler(SlowScheduler):
    """A long queue of pending jobs (their output /dev/null) whose full listing takes 0.3 s,
    one job that starts later, and the active listing squeue's state filter gives."""

    def __init__(self, log: Path, pending: int) -> None:
        super().__init__(log, listing_s=0.3)
        self.started = False
        self.pending = [
            Job(job_id=str(1000 + i), state=JobState.PENDING, comment="relaunch=on",
                stdout_path="/dev/null")
            for i in range(pending)
        ]  # fmt: skip

    async def list_jobs(self) -> list[Job]:
        running = await super().list_jobs()  # takes listing_s
        return [*self.pending, *(running if self.started else [])]

    async def list_active_jobs(self) -> list[Job]:
        self.calls["list_active_jobs"] += 1
        return [self.job()] if self.started else []  # cheap: the state filter


async def test_a_job_that_starts_is_watched_within_the_active_pace_not_the_full_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With a full listing that costs 0.3 s (every 6 s at 5 %), a job that starts is listed
    by the active listing within active_interval_s, its log line found; the pending jobs'
    output is never opened."""
    opened: list[str] = []
    real_open = os.open

    def spy_open(path: object, *args: object, **kwargs: object) -> int:
        opened.append(str(path))
        return real_open(path, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "open", spy_open)
    log = tmp_path / "job-7.out"
    log.write_text("")
    sched = QueueScheduler(log, pending=200)
    delivered: list[Detection] = []

    async def deliver(det: Detection) -> None:
        delivered.append(det)

    config = WatchConfig(
        cluster="dev",
        poll_interval_s=0.1,
        log_interval_s=0.05,
        log_quiet_max_s=0.1,
        active_interval_s=0.3,
    )
    watcher = Watcher(config, sched, deliver)
    stop = asyncio.Event()
    running = asyncio.create_task(watcher.run(stop))
    try:
        await asyncio.sleep(0.5)
        sched.started = True
        with log.open("a") as out:
            out.write("0: RuntimeError: CUDA error: uncorrectable ECC error encountered\n")
        took = await _until(lambda: delivered, timeout=3.0)
        assert took < 1.0, took  # the active pace (0.3 s), not the full one (6 s)
        assert delivered[0].kind == "signature:cuda_ecc"
        assert sched.calls["list_jobs"] == 1, sched.calls  # the first full listing only
        assert sched.calls["list_active_jobs"] >= 2
        assert "/dev/null" not in opened
    finally:
        stop.set()
        await asyncio.wait_for(running, timeout=10)


def test_the_configured_paces_reach_the_watcher() -> None:
    from relaunch.models.config import ClusterConfig
    from relaunch.workers.watch_main import watch_config

    config = ClusterConfig(
        name="dev",
        database_url="postgresql://unused",
        bundle_dir="/tmp",
        watch=WatchSettings(
            reconcile_s=20, active_interval_s=3, node_interval_s=7, log_quiet_max_s=0.5
        ),
    )
    watch = watch_config(config)
    assert (watch.reconcile_s, watch.active_interval_s, watch.node_interval_s) == (20, 3, 7)
    assert watch.log_quiet_max_s == 0.5 and watch.listing_share == 0.02


async def test_a_failing_controller_is_asked_at_the_pace_not_at_every_turn(
    tmp_path: Path,
) -> None:
    """squeue failing (a controller down) is tried again at the listings' pace (the active
    listing every 0.3 s here), never at every turn of the loop (every 0.05 s log pass)."""
    from relaunch.models.errors import SchedulerError

    log = tmp_path / "job-7.out"
    log.write_text("")
    sched = QueueScheduler(log, pending=5)
    sched.listing_s = 0.05  # at a 0.1 % share: a full listing every reconcile_s (30 s)
    failing = False

    async def active() -> list[Job]:
        sched.calls["list_active_jobs"] += 1
        if failing:
            raise SchedulerError("slurm_load_jobs error: Unable to contact slurm controller")
        return []

    sched.list_active_jobs = active  # type: ignore[method-assign]

    async def deliver(det: Detection) -> None:
        return None

    config = WatchConfig(
        cluster="dev",
        poll_interval_s=0.1,
        log_interval_s=0.05,
        active_interval_s=0.3,
        listing_share=0.001,
    )
    watcher = Watcher(config, sched, deliver)
    stop = asyncio.Event()
    running = asyncio.create_task(watcher.run(stop))
    try:
        await asyncio.sleep(0.5)
        failing, before = True, sched.calls["list_active_jobs"]
        await asyncio.sleep(1.5)
        tried = sched.calls["list_active_jobs"] - before
        assert 3 <= tried <= 7, tried  # ~5 at 0.3 s; every 0.05 s would be ~30
        assert watcher.stats.errors >= 3
    finally:
        stop.set()
        await asyncio.wait_for(running, timeout=10)
