"""The watcher's fast signs of a silent failure: slurmd probes (a real LivenessMonitor over real
local sockets), agent heartbeats (real heartbeat files), the job's own progress holding either
back, and the job's own limits for hangs and ranks left behind."""

from __future__ import annotations

import asyncio
import collections
import json
import logging
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from relaunch.connectors.liveness import (
    LivenessMonitor,
    ProbeResult,
    ProbeTarget,
    make_prober,
    raw_sockets_permitted,
)
from relaunch.connectors.telemetry.heartbeat import (
    heartbeat_path,
    remove_heartbeat,
    write_heartbeat,
)
from relaunch.models.config import ClusterConfig, WatchSettings
from relaunch.models.node_decision import NodeReport
from relaunch.models.recovery import Detection, DetectionSource
from relaunch.models.scheduler import Job, JobState, Node, NodeFlag, NodeState, comment_duration
from relaunch.workers import watch_handover
from relaunch.workers.watch_liveness import Heartbeat
from relaunch.workers.watch_main import liveness_monitor, watch_config
from relaunch.workers.watcher import WatchConfig, Watcher
from tests.unit.test_watcher import FakeScheduler, append, ignore

T0 = datetime(2026, 2, 20, 9, 0, 0, tzinfo=UTC)


@dataclass
class Slurmd:
    """A listening socket standing for one node's slurmd; ``kill`` makes it refuse."""

    server: asyncio.Server
    port: int

    async def kill(self) -> None:
        self.server.close()
        await self.server.wait_closed()


async def start_slurmd() -> Slurmd:
    async def hang_up(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.close()

    server = await asyncio.start_server(hang_up, "127.0.0.1", 0)
    return Slurmd(server, server.sockets[0].getsockname()[1])


class RecordingProber:
    """The real connect prober, remembering each round's targets."""

    def __init__(self) -> None:
        self._real = make_prober("connect")
        self.method = self._real.method
        self.rounds: list[list[ProbeTarget]] = []

    async def probe(self, targets: Sequence[ProbeTarget], timeout_s: float) -> list[ProbeResult]:
        self.rounds.append(list(targets))
        return await self._real.probe(targets, timeout_s)

    async def close(self) -> None:
        await self._real.close()


@pytest.fixture
async def nodes() -> AsyncIterator[dict[str, Slurmd]]:
    daemons = {name: await start_slurmd() for name in ("n1", "n2")}
    yield daemons
    for daemon in daemons.values():
        daemon.server.close()


def job(job_id: str, nodes: list[str], log: Path, **changes: object) -> Job:
    return Job(
        job_id=job_id,
        user_id=os.getuid(),
        group_id=os.getgid(),
        state=JobState.RUNNING,
        partition="debug",
        comment="relaunch=on",
        nodes=nodes,
        num_tasks=len(nodes),
        stdout_path=str(log),
        stderr_path=str(log),
    ).model_copy(update=changes)


def cluster(daemons: dict[str, Slurmd], jobs: list[Job]) -> FakeScheduler:
    fake = FakeScheduler()
    fake.nodes = [
        Node(name=name, state=NodeState.ALLOCATED, address="127.0.0.1", port=daemon.port)
        for name, daemon in daemons.items()
    ]
    fake.jobs = jobs
    return fake


def watcher_for(
    scheduler: FakeScheduler,
    tmp_path: Path,
    monitor: LivenessMonitor | None = None,
    on_detection: object = ignore,
    **config: object,
) -> Watcher:
    settings: dict[str, object] = {
        "cluster": "dev",
        "telemetry_pattern": str(tmp_path / "nodes" / "{node}" / "telemetry.jsonl"),
    }
    settings.update(config)
    return Watcher(
        WatchConfig.model_validate(settings),
        scheduler,
        on_detection,  # type: ignore[arg-type]
        liveness=monitor,
    )


# ---------------------------------------------------------------- probes


async def test_a_dead_slurmd_is_reported_after_three_failed_probes(
    nodes: dict[str, Slurmd], tmp_path: Path
) -> None:
    scheduler = cluster(nodes, [job("101", ["n1", "n2"], tmp_path / "101.out")])
    monitor = LivenessMonitor(make_prober("connect"), interval_s=0.1, timeout_s=0.5, failures=3)
    watcher = watcher_for(scheduler, tmp_path, monitor)
    assert await watcher.poll_once() == []
    await monitor.probe_once()
    assert watcher.read_logs_once() == []  # both answer

    await nodes["n2"].kill()
    killed = datetime.now(UTC)
    for _ in range(2):
        await monitor.probe_once()
        assert watcher.read_logs_once() == []  # one or two lost probes are not a dead node
    await monitor.probe_once()
    (found,) = watcher.read_logs_once()
    assert (found.kind, found.source, found.nodes) == (
        "node_unreachable",
        DetectionSource.PROBE,
        ["n2"],
    )
    assert found.fault_time is not None
    assert killed <= found.fault_time < killed + timedelta(seconds=1)  # the first failed probe
    assert f"n2 slurmd 127.0.0.1:{nodes['n2'].port}: refused ×3 since" in found.text
    assert found.text.endswith("(connect probe)")
    await monitor.probe_once()
    assert watcher.read_logs_once() == []  # once per attempt
    assert await watcher.poll_once() == []
    assert (watcher.stats.unreachable_nodes, watcher.stats.probed_nodes) == (1, 2)
    assert watcher.stats.probe_failures == 4


def reporting_watcher(
    nodes: dict[str, Slurmd],
    jobs: list[Job],
    on_detection: Callable[[Detection], Awaitable[None]],
    on_node_report: Callable[[NodeReport], Awaitable[None]],
    acts_alone: Callable[[NodeReport], bool] | None = None,
) -> tuple[Watcher, LivenessMonitor]:
    """A watcher of ``jobs`` on ``nodes`` that probes them and reports dead ones."""
    monitor = LivenessMonitor(make_prober("connect"), interval_s=0.1, timeout_s=0.5, failures=3)
    watcher = Watcher(
        WatchConfig(cluster="dev"),
        cluster(nodes, jobs),
        on_detection,
        liveness=monitor,
        on_node_report=on_node_report,
        report_acts_alone=acts_alone,
    )
    return watcher, monitor


async def n2_dies_and_is_reported(
    watcher: Watcher, nodes: dict[str, Slurmd], monitor: LivenessMonitor
) -> tuple[list[Detection], collections.deque[Detection]]:
    """n2's slurmd dies; three probe rounds find it; a log pass detects its jobs, the watcher
    reports n2, then hands the detections over. What was found, and what is still pending."""
    assert await watcher.poll_once() == []
    await nodes["n2"].kill()
    for _ in range(3):
        await monitor.probe_once()
    found = watcher.read_logs_once()
    await watcher._reports.report(found)
    pending = collections.deque(found)
    await watcher._deliver(pending)
    return found, pending


async def test_a_dead_node_is_reported_once_with_its_jobs_and_partitions(
    nodes: dict[str, Slurmd], tmp_path: Path
) -> None:
    jobs = [
        job("201", ["n2"], tmp_path / "201.out"),
        job("202", ["n2"], tmp_path / "202.out", partition="gpu"),
        job("203", ["n1"], tmp_path / "203.out"),
    ]
    order: list[str] = []

    async def on_detection(det: Detection) -> None:
        order.append(f"job {det.job_id}")

    async def on_node_report(report: NodeReport) -> None:
        order.append(f"node {report.node}")
        reports.append(report)

    reports: list[NodeReport] = []
    watcher, monitor = reporting_watcher(nodes, jobs, on_detection, on_node_report)
    found, pending = await n2_dies_and_is_reported(watcher, nodes, monitor)
    assert sorted(d.job_id for d in found) == ["201", "202"]
    # One report for the node (what the probes saw, its watched jobs); the jobs' own recoveries
    # wait for its decision to drain it (it requeues them ahead of their joins).
    assert order == ["node n2"] and len(pending) == 2
    [report] = reports
    assert (report.node, report.jobs, report.partitions) == ("n2", 2, ["debug", "gpu"])
    assert [j.job_id for j in report.running] == ["201", "202"]
    assert report.failing_since == found[0].fault_time and "refused ×3" in report.text
    # The poll sees n2 drained: the recoveries start, and join a decision that has acted.
    scheduler = watcher._scheduler
    assert isinstance(scheduler, FakeScheduler)
    scheduler.set_node("n2", flags=[NodeFlag.DRAIN])
    await watcher.poll_once()
    await watcher._deliver(pending)
    assert sorted(order) == ["job 201", "job 202", "node n2"] and not pending
    # The same failure is not reported again (a later detection of it, a redelivery).
    await watcher._reports.report(found)
    await watcher._deliver(collections.deque(found))
    assert len(reports) == 1


async def test_a_reported_nodes_jobs_are_handed_over_after_the_lead_without_a_drain(
    nodes: dict[str, Slurmd], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A decision that does not drain (it waits for an approval, its guard refused): the
    jobs' recoveries start DECISION_LEAD_S after the report all the same."""
    monkeypatch.setattr(watch_handover, "DECISION_LEAD_S", 0.3)
    order: list[str] = []

    async def on_detection(det: Detection) -> None:
        order.append(f"job {det.job_id}")

    async def on_node_report(report: NodeReport) -> None:
        order.append(f"node {report.node}")

    watcher, monitor = reporting_watcher(
        nodes, [job("301", ["n2"], tmp_path / "301.out")], on_detection, on_node_report
    )
    _, pending = await n2_dies_and_is_reported(watcher, nodes, monitor)
    assert order == ["node n2"]
    await asyncio.sleep(0.3)
    await watcher._deliver(pending)
    assert order == ["node n2", "job 301"] and not pending


async def test_a_reported_nodes_jobs_wait_for_no_drain_a_person_must_approve(
    nodes: dict[str, Slurmd], tmp_path: Path
) -> None:
    """Monitor mode: the decision waits for an approval before it drains, so the jobs'
    recoveries start at once and show what awaits them (an approval that expires before
    DECISION_LEAD_S would otherwise end them before anyone saw them)."""
    order: list[str] = []
    asked: list[tuple[list[str], str]] = []

    async def on_detection(det: Detection) -> None:
        order.append(f"job {det.job_id}")

    async def on_node_report(report: NodeReport) -> None:
        order.append(f"node {report.node}")

    def monitor_mode(report: NodeReport) -> bool:
        asked.append((report.partitions, report.category.value))
        return False

    watcher, monitor = reporting_watcher(
        nodes,
        [job("601", ["n2"], tmp_path / "601.out")],
        on_detection,
        on_node_report,
        monitor_mode,
    )
    _, pending = await n2_dies_and_is_reported(watcher, nodes, monitor)
    assert order == ["node n2", "job 601"] and not pending
    assert asked == [(["debug"], "node_failure")]


async def test_a_reported_nodes_jobs_go_once_drained_though_none_runs(
    nodes: dict[str, Slurmd], tmp_path: Path
) -> None:
    """The decision requeued the node's only job ahead of its join: no job runs, yet the poll
    still lists the nodes while a recovery waits for its node's drain, and sees it."""
    order: list[str] = []

    async def on_detection(det: Detection) -> None:
        order.append(f"job {det.job_id}")

    async def on_node_report(report: NodeReport) -> None:
        order.append(f"node {report.node}")

    watcher, monitor = reporting_watcher(
        nodes, [job("701", ["n2"], tmp_path / "701.out")], on_detection, on_node_report
    )
    _, pending = await n2_dies_and_is_reported(watcher, nodes, monitor)
    assert order == ["node n2"] and len(pending) == 1
    scheduler = watcher._scheduler
    assert isinstance(scheduler, FakeScheduler)
    scheduler.set_job(state=JobState.PENDING, nodes=[])  # requeued ahead, waiting to start
    scheduler.set_node("n2", flags=[NodeFlag.DRAIN])
    listed = scheduler.calls["list_nodes"]
    await watcher.poll_once()
    assert scheduler.calls["list_nodes"] == listed + 1
    await watcher._deliver(pending)
    assert order == ["node n2", "job 701"] and not pending
    await watcher.poll_once()  # nothing waits and nothing runs: the nodes are not listed
    assert scheduler.calls["list_nodes"] == listed + 1


async def test_a_report_that_reaches_a_running_decision_does_not_hold_the_jobs(
    nodes: dict[str, Slurmd], tmp_path: Path
) -> None:
    """The node's decision was running already (an earlier failure's, open for its late joins,
    maybe about to close on a node someone put back): it may not drain for this report, so the
    jobs' recoveries are not held for it."""
    order: list[str] = []

    async def on_detection(det: Detection) -> None:
        order.append(f"job {det.job_id}")

    async def running_already(report: NodeReport) -> bool:
        order.append(f"node {report.node}")
        return False

    watcher, monitor = reporting_watcher(
        nodes, [job("501", ["n2"], tmp_path / "501.out")], on_detection, running_already
    )
    _, pending = await n2_dies_and_is_reported(watcher, nodes, monitor)
    assert order == ["node n2", "job 501"] and not pending


async def test_a_reported_nodes_jobs_wait_from_the_report_and_go_at_once_if_it_fails(
    nodes: dict[str, Slurmd], tmp_path: Path
) -> None:
    """The jobs' recoveries wait from the moment the report is made, not from its answer (a
    loaded server answers late); a report that fails reaches no decision, so they go at once."""
    order: list[str] = []
    answered = asyncio.Event()

    async def on_detection(det: Detection) -> None:
        order.append(f"job {det.job_id}")

    async def slow_then_fails(report: NodeReport) -> None:
        await answered.wait()
        raise RuntimeError("Temporal unavailable")

    watcher, monitor = reporting_watcher(
        nodes, [job("401", ["n2"], tmp_path / "401.out")], on_detection, slow_then_fails
    )
    assert await watcher.poll_once() == []
    await nodes["n2"].kill()
    for _ in range(3):
        await monitor.probe_once()
    found = watcher.read_logs_once()
    watcher._reports.start(found)  # the report's round trip is under way
    await asyncio.sleep(0)
    pending = collections.deque(found)
    await watcher._deliver(pending)
    assert order == [] and len(pending) == 1  # waiting for the decision, not for the answer
    answered.set()
    await watcher._reports.wait(timeout=5)
    await watcher._deliver(pending)
    assert order == ["job 401"] and not pending


async def test_detection_within_failures_times_interval_while_running(
    nodes: dict[str, Slurmd], tmp_path: Path
) -> None:
    interval, failures = 0.2, 3
    scheduler = cluster(nodes, [job("101", ["n1", "n2"], tmp_path / "101.out")])
    monitor = LivenessMonitor(
        make_prober("connect"), interval_s=interval, timeout_s=0.5, failures=failures
    )
    seen: list[tuple[float, Detection]] = []
    delivered = asyncio.Event()

    async def record(det: Detection) -> None:
        seen.append((time.monotonic(), det))
        delivered.set()

    watcher = watcher_for(scheduler, tmp_path, monitor, record, log_interval_s=0.1)
    stop = asyncio.Event()
    running = asyncio.create_task(watcher.run(stop))
    try:
        async with asyncio.timeout(10):
            while not all((s := monitor.state(n)) and s.last_ok for n in ("n1", "n2")):
                monitor.round_done.clear()
                await monitor.round_done.wait()  # until both nodes answered a probe
        await nodes["n1"].kill()
        killed = time.monotonic()
        await asyncio.wait_for(delivered.wait(), 10)
    finally:
        stop.set()
        await asyncio.wait_for(running, 15)
    ((at, det),) = seen
    assert (det.kind, det.nodes) == ("node_unreachable", ["n1"])
    # failures x interval, plus a round under way when the node died, one log pass, and
    # room for a loaded machine.
    assert at - killed < (failures + 1) * interval + 0.1 + 1.0


async def test_one_probe_per_node_however_many_jobs_share_it(
    nodes: dict[str, Slurmd], tmp_path: Path
) -> None:
    jobs = [
        job("101", ["n1"], tmp_path / "101.out"),
        job("102", ["n1", "n2"], tmp_path / "102.out"),
        job("103", [], tmp_path / "103.out", state=JobState.PENDING),
    ]
    scheduler = cluster(nodes, jobs)
    prober = RecordingProber()
    monitor = LivenessMonitor(prober, interval_s=0.1, timeout_s=0.5, failures=1)
    watcher = watcher_for(scheduler, tmp_path, monitor)
    await watcher.poll_once()
    await monitor.probe_once()
    (targets,) = prober.rounds
    assert sorted(t.node for t in targets) == ["n1", "n2"]

    await nodes["n1"].kill()
    await monitor.probe_once()
    found = watcher.read_logs_once()
    # Both jobs on n1 hear of it; n2 answers and is never reported.
    assert sorted((d.job_id, tuple(d.nodes)) for d in found) == [
        ("101", ("n1",)),
        ("102", ("n1",)),
    ]


async def test_nodes_slurm_lists_down_or_without_an_address_are_not_probed(
    nodes: dict[str, Slurmd], tmp_path: Path
) -> None:
    scheduler = cluster(nodes, [job("101", ["n1", "n2", "n3"], tmp_path / "101.out")])
    scheduler.nodes.append(Node(name="n3", state=NodeState.ALLOCATED))  # no address known
    prober = RecordingProber()
    monitor = LivenessMonitor(prober, interval_s=0.1, timeout_s=0.5, failures=1)
    watcher = watcher_for(scheduler, tmp_path, monitor)
    scheduler.set_node("n2", state=NodeState.DOWN)
    await watcher.poll_once()
    await monitor.probe_once()
    assert [t.node for t in prober.rounds[-1]] == ["n1"]
    assert monitor.state("n2") is None

    scheduler.set_job(state=JobState.COMPLETED)  # nothing running: nothing probed
    await watcher.poll_once()
    assert monitor.state("n1") is None


async def test_a_hostile_node_address_is_skipped_not_raised(
    nodes: dict[str, Slurmd], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    scheduler = cluster(nodes, [job("101", ["n1", "n2"], tmp_path / "101.out")])
    scheduler.set_node("n2", address="-oProxyCommand=x")
    monitor = LivenessMonitor(RecordingProber(), interval_s=0.1, timeout_s=0.5, failures=1)
    watcher = watcher_for(scheduler, tmp_path, monitor)
    with caplog.at_level(logging.WARNING):
        assert await watcher.poll_once() == []
        assert await watcher.poll_once() == []
    assert caplog.text.count("not probing node n2") == 1
    assert monitor.state("n2") is None and monitor.state("n1") is not None


# ---------------------------------------------------------------- heartbeats


def beat(telemetry: Path, at: datetime, node: str | None = None) -> Path:
    """What the agent's file sink does at a beat, with the file's mtime set to ``at`` (the
    watcher's clock is injected in these tests)."""
    path = heartbeat_path(telemetry)
    write_heartbeat(path, node or telemetry.parent.name, at)
    stamp = int(at.timestamp() * 1e9)
    os.utime(path, ns=(stamp, stamp))
    return path


async def test_heartbeat_lost_after_the_timeout_not_at_first_sight_of_an_old_file(
    tmp_path: Path,
) -> None:
    n2 = tmp_path / "nodes" / "n2" / "telemetry.jsonl"
    beat(n2, T0 - timedelta(hours=1))  # an agent that stopped an hour ago
    scheduler = FakeScheduler()
    scheduler.jobs = [job("101", ["n1", "n2"], tmp_path / "101.out")]
    watcher = watcher_for(scheduler, tmp_path)
    assert await watcher.poll_once(T0) == []
    assert await watcher.poll_once(T0 + timedelta(seconds=60)) == []  # not a source yet
    assert watcher.stats.heartbeat_nodes == 0

    beat(n2, T0 + timedelta(seconds=61))  # the agent starts again
    assert await watcher.poll_once(T0 + timedelta(seconds=61)) == []
    assert watcher.stats.heartbeat_nodes == 1
    assert await watcher.poll_once(T0 + timedelta(seconds=76)) == []  # 15 s: not yet
    # The heartbeat file is judged once per poll: a log pass alone does not call it lost.
    assert watcher.read_logs_once(T0 + timedelta(seconds=90)) == []
    (found,) = await watcher.poll_once(T0 + timedelta(seconds=91))
    assert (found.kind, found.source, found.nodes) == (
        "heartbeat_lost",
        DetectionSource.TELEMETRY,
        ["n2"],
    )
    assert found.fault_time == T0 + timedelta(seconds=61)
    assert "no agent heartbeat for 30s" in found.text
    assert not n2.exists()  # beats never touch the telemetry file


async def test_a_beating_agent_is_never_reported_and_a_fresh_file_counts_at_once(
    tmp_path: Path,
) -> None:
    n1 = tmp_path / "nodes" / "n1" / "telemetry.jsonl"
    beat(n1, T0 - timedelta(seconds=3))
    scheduler = FakeScheduler()
    scheduler.jobs = [job("101", ["n1"], tmp_path / "101.out")]
    watcher = watcher_for(scheduler, tmp_path)
    assert await watcher.poll_once(T0) == []
    assert watcher.stats.heartbeat_nodes == 1  # fresh at first sight: a source at once
    for second in range(5, 60, 5):
        beat(n1, T0 + timedelta(seconds=second))
        assert await watcher.poll_once(T0 + timedelta(seconds=second)) == []
    (found,) = await watcher.poll_once(T0 + timedelta(seconds=71))
    assert found.kind == "heartbeat_lost" and found.fault_time == T0 + timedelta(seconds=55)


async def test_a_beat_is_timed_by_the_watcher_not_by_the_file(tmp_path: Path) -> None:
    # The node (or the file server) runs an hour ahead: each change is still a beat, seen
    # when the watcher saw it, and the fault time is the watcher's.
    n1 = tmp_path / "nodes" / "n1" / "telemetry.jsonl"
    ahead = timedelta(hours=1)
    scheduler = FakeScheduler()
    scheduler.jobs = [job("101", ["n1"], tmp_path / "101.out")]
    watcher = watcher_for(scheduler, tmp_path)
    for second in range(0, 30, 5):
        beat(n1, T0 + ahead + timedelta(seconds=second))
        assert await watcher.poll_once(T0 + timedelta(seconds=second)) == []
    assert await watcher.poll_once(T0 + timedelta(seconds=40)) == []
    (found,) = await watcher.poll_once(T0 + timedelta(seconds=41))
    assert found.kind == "heartbeat_lost" and found.fault_time == T0 + timedelta(seconds=25)


async def test_a_stopped_agent_or_another_nodes_file_is_no_source(tmp_path: Path) -> None:
    n1 = tmp_path / "nodes" / "n1" / "telemetry.jsonl"
    n2 = tmp_path / "nodes" / "n2" / "telemetry.jsonl"
    scheduler = FakeScheduler()
    scheduler.jobs = [job("101", ["n1", "n2"], tmp_path / "101.out")]
    watcher = watcher_for(scheduler, tmp_path)
    first = beat(n1, T0)
    beat(n2, T0, node="n7")  # an agent started with the wrong --node
    assert await watcher.poll_once(T0) == []
    assert watcher.stats.heartbeat_nodes == 1
    first.unlink()  # what a clean stop of the agent does
    assert await watcher.poll_once(T0 + timedelta(seconds=1)) == []
    assert await watcher.poll_once(T0 + timedelta(seconds=60)) == []
    assert watcher.stats.heartbeat_nodes == 0


def test_time_the_watcher_could_not_look_is_not_the_agents_silence(tmp_path: Path) -> None:
    path = beat(tmp_path / "nodes" / "n1" / "telemetry.jsonl", T0)
    heartbeat = Heartbeat("n1", path)
    heartbeat.look(T0, 15)
    blocked = tmp_path / "unreadable"
    blocked.mkdir()  # opening a folder fails: the watcher's trouble, not the node's
    heartbeat.path = blocked
    heartbeat.look(T0 + timedelta(seconds=30), 15)
    assert heartbeat.lost(T0 + timedelta(seconds=30), 15) is None
    heartbeat.path = path  # readable again, unchanged: the silence counts from now
    heartbeat.look(T0 + timedelta(seconds=40), 15)
    assert heartbeat.lost(T0 + timedelta(seconds=55), 15) is None
    assert heartbeat.lost(T0 + timedelta(seconds=56), 15) == T0 + timedelta(seconds=40)


async def test_the_agent_removes_its_file_on_a_clean_stop_only(tmp_path: Path) -> None:
    path = beat(tmp_path / "nodes" / "n1" / "telemetry.jsonl", T0)
    assert json.loads(path.read_text()) == {
        "node": "n1",
        "time": T0.isoformat(),
        "pid": os.getpid(),
    }
    assert [p.name for p in path.parent.iterdir()] == ["heartbeat"]  # no temporary left
    path.write_text(json.dumps({"node": "n1", "time": T0.isoformat(), "pid": 1}))
    remove_heartbeat(path)
    assert path.exists()  # another agent's file
    beat(path.with_name("telemetry.jsonl"), T0)
    remove_heartbeat(path)
    assert not path.exists()


# ---------------------------------------------------------------- the job's own word


async def test_a_node_whose_ranks_still_advance_is_not_called_unreachable(
    nodes: dict[str, Slurmd], tmp_path: Path
) -> None:
    """slurmd on n2 stops answering (say, restarted for an upgrade) while rank 1 goes on
    training there: job 101 is not told; job 102 on n2, which prints nothing, is. Once rank 1
    stops for longer than the job's lag limit, 101 is told too."""
    log = tmp_path / "101.out"
    scheduler = cluster(nodes, [job("101", ["n1", "n2"], log), job("102", ["n2"], tmp_path / "x")])
    monitor = LivenessMonitor(make_prober("connect"), interval_s=0.1, timeout_s=0.5, failures=3)
    watcher = watcher_for(scheduler, tmp_path, monitor, stall_k=0.5)  # lag limit: 5 s
    base = datetime.now(UTC)

    def at(second: int) -> datetime:
        return base + timedelta(seconds=second)

    assert await watcher.poll_once(at(0)) == []
    await monitor.probe_once()
    progress(log, 1)
    assert watcher.read_logs_once(at(1)) == []

    await nodes["n2"].kill()
    for _ in range(3):
        await monitor.probe_once()
    down = monitor.state("n2")
    assert down is not None and down.failing_since is not None
    assert down.failing_since < at(10)  # the passes below come after the failures began
    progress(log, 10)
    found = watcher.read_logs_once(at(10))
    assert [(d.job_id, d.kind, d.nodes) for d in found] == [("102", "node_unreachable", ["n2"])]
    progress(log, 14, ranks=(0,))
    assert watcher.read_logs_once(at(14)) == []  # rank 1 advanced 4 s ago
    progress(log, 16, ranks=(0,))
    (late,) = watcher.read_logs_once(at(16))  # 6 s: it no longer vouches for n2
    assert (late.job_id, late.kind, late.nodes) == ("101", "node_unreachable", ["n2"])
    assert late.fault_time == down.failing_since


async def test_advances_from_before_the_failure_do_not_hold_it_back(
    nodes: dict[str, Slurmd], tmp_path: Path
) -> None:
    log = tmp_path / "101.out"
    scheduler = cluster(nodes, [job("101", ["n1", "n2"], log)])
    monitor = LivenessMonitor(make_prober("connect"), interval_s=0.1, timeout_s=0.5, failures=3)
    watcher = watcher_for(scheduler, tmp_path, monitor)
    assert await watcher.poll_once() == []
    progress(log, 1)
    assert watcher.read_logs_once() == []  # rank 1 on n2 advanced: before the failure
    await nodes["n2"].kill()
    for _ in range(3):
        await monitor.probe_once()
    (found,) = watcher.read_logs_once()
    assert (found.kind, found.nodes) == ("node_unreachable", ["n2"])


async def test_a_node_whose_ranks_advance_is_not_reported_for_a_silent_agent(
    tmp_path: Path,
) -> None:
    # The agent died (OOM-killed, say) while the job goes on: not a node failure.
    log = tmp_path / "101.out"
    scheduler = FakeScheduler()
    scheduler.jobs = [job("101", ["n1", "n2"], log)]
    watcher = watcher_for(scheduler, tmp_path, stall_k=0.5)  # lag limit: 5 s
    beat(tmp_path / "nodes" / "n2" / "telemetry.jsonl", T0)
    for second in range(31):
        progress(log, second)
        assert await watcher.poll_once(T0 + timedelta(seconds=second)) == []
    for second in range(31, 36):  # the whole job pauses: under 5 s, n2 is still vouched for
        assert await watcher.poll_once(T0 + timedelta(seconds=second)) == []
    (found,) = await watcher.poll_once(T0 + timedelta(seconds=36))
    assert (found.kind, found.nodes, found.fault_time) == ("heartbeat_lost", ["n2"], T0)


# ---------------------------------------------------------------- limits that follow the job


def progress(log: Path, second: int, ranks: Sequence[int] = (0, 1)) -> None:
    append(log, "".join(f"{r}: step={second} loss=1 rank={r} node=n{r + 1}\n" for r in ranks))


async def test_a_rank_stops_while_its_peer_goes_on_reported_after_the_lag_floor(
    tmp_path: Path,
) -> None:
    log = tmp_path / "101.out"
    scheduler = FakeScheduler()
    scheduler.jobs = [job("101", ["n1", "n2"], log)]
    watcher = watcher_for(scheduler, tmp_path, stall_k=2.0)  # k x 1 s < the 5 s floor
    for second in range(40):
        progress(log, second, (0, 1) if second < 10 else (0,))
        found = await watcher.poll_once(T0 + timedelta(seconds=second))
        if found:
            break
    (det,) = found
    assert (det.kind, det.nodes) == ("progress_stalled_rank", ["n2"])
    assert second == 15  # rank 1 last advanced at 9 s: more than 5 s later
    assert det.fault_time == T0 + timedelta(seconds=9)


async def test_the_job_comment_sets_its_own_lag_floor(tmp_path: Path) -> None:
    log = tmp_path / "101.out"
    scheduler = FakeScheduler()
    scheduler.jobs = [job("101", ["n1", "n2"], log, comment="relaunch=on,lag_after=20s")]
    watcher = watcher_for(scheduler, tmp_path)
    for second in range(60):
        progress(log, second, (0, 1) if second < 10 else (0,))
        found = await watcher.poll_once(T0 + timedelta(seconds=second))
        if found:
            break
    assert [d.kind for d in found] == ["progress_stalled_rank"]
    assert second == 30  # rank 1 last advanced at 9 s: more than 20 s later


async def test_a_whole_job_pause_under_the_floor_is_not_a_hang(tmp_path: Path) -> None:
    log = tmp_path / "101.out"
    scheduler = FakeScheduler()
    scheduler.jobs = [job("101", ["n1", "n2"], log)]
    watcher = watcher_for(scheduler, tmp_path)
    second = 0
    for second in range(10):
        progress(log, second)
        assert await watcher.poll_once(T0 + timedelta(seconds=second)) == []
    for second in range(10, 50):  # a 40 s evaluation pause: nobody prints
        assert await watcher.poll_once(T0 + timedelta(seconds=second)) == []
    for second in range(50, 60):
        progress(log, second)
        assert await watcher.poll_once(T0 + timedelta(seconds=second)) == []
    # Now the longest pause seen is 41 s: the next is a hang after 1.5 x 41 s, not 45 s.
    last = T0 + timedelta(seconds=59)
    assert await watcher.poll_once(last + timedelta(seconds=61)) == []
    (hang,) = await watcher.poll_once(last + timedelta(seconds=62))
    assert (hang.kind, hang.fault_time) == ("hang", last)


async def test_a_silent_hang_is_seen_after_45_seconds(tmp_path: Path) -> None:
    log = tmp_path / "101.out"
    scheduler = FakeScheduler()
    scheduler.jobs = [job("101", ["n1", "n2"], log)]
    watcher = watcher_for(scheduler, tmp_path)
    for second in range(10):
        progress(log, second)
        await watcher.poll_once(T0 + timedelta(seconds=second))
    last = T0 + timedelta(seconds=9)
    assert await watcher.poll_once(last + timedelta(seconds=45)) == []
    (hang,) = await watcher.poll_once(last + timedelta(seconds=46))
    assert hang.kind == "hang"


@pytest.mark.parametrize(
    ("comment", "quiet", "hang"),
    [
        ("relaunch=on,hang_after=300", 299, 301),
        ("relaunch=on,hang_after=10m", 599, 601),
        ("relaunch=on,hang_after=banana", 45, 46),  # ignored: the configured floor
        ("relaunch=on,hang_after=1", 45, 46),  # under 5 s: ignored
        ("relaunch=on,hang_after=99999999h", 45, 46),  # over 7 days: ignored
    ],
)
async def test_the_job_comment_sets_its_own_hang_floor(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, comment: str, quiet: int, hang: int
) -> None:
    log = tmp_path / "101.out"
    scheduler = FakeScheduler()
    scheduler.jobs = [job("101", ["n1", "n2"], log, comment=comment)]
    other = job("102", ["n1", "n2"], tmp_path / "102.out")  # another job keeps 45 s
    scheduler.jobs.append(other)
    watcher = watcher_for(scheduler, tmp_path)
    with caplog.at_level(logging.WARNING):
        for second in range(10):
            progress(log, second)
            progress(tmp_path / "102.out", second)
            await watcher.poll_once(T0 + timedelta(seconds=second))
        last = T0 + timedelta(seconds=9)
        found = await watcher.poll_once(last + timedelta(seconds=quiet))
        assert [d.job_id for d in found] == ([] if quiet < 46 else ["102"])
        found = await watcher.poll_once(last + timedelta(seconds=hang))
        assert "101" in {d.job_id for d in found if d.kind == "hang"}
    bad = "banana" in comment or comment.endswith(("=1", "h"))
    assert caplog.text.count("ignoring hang_after") == (1 if bad else 0)


def test_comment_durations() -> None:
    assert [comment_duration(v) for v in ("300", "90s", "10m", "2h", " 1.5M ")] == [
        300.0,
        90.0,
        600.0,
        7200.0,
        90.0,
    ]
    for bad in ("", "-5", "1e9", "5d", "4", "169h", "10 m", "0x10"):
        with pytest.raises(ValueError):
            comment_duration(bad)


# ---------------------------------------------------------------- `relaunch watch` wiring


def cluster_config(**watch: object) -> ClusterConfig:
    return ClusterConfig(
        name="dev",
        database_url="postgresql://localhost/relaunch",
        bundle_dir="/tmp/bundles",
        watch=WatchSettings.model_validate(watch),
    )


async def test_relaunch_watch_builds_its_monitor_from_the_settings(
    caplog: pytest.LogCaptureFixture,
) -> None:
    config = cluster_config(
        probe_method="connect", probe_interval_s=0.5, probe_failures=4, lag_floor_s=8
    )
    runner, monitor = await liveness_monitor(config)
    assert runner is None and monitor is not None
    assert (monitor.prober.method, monitor.interval_s, monitor.failures) == ("connect", 0.5, 4)
    settings = watch_config(config)
    assert (settings.hang_threshold_s, settings.lag_floor_s) == (45, 8)
    assert settings.heartbeat_timeout_s == 15

    assert await liveness_monitor(cluster_config(probe_enabled=False)) == (None, None)
    with caplog.at_level(logging.ERROR):
        runner, monitor = await liveness_monitor(cluster_config(probe_method="syn"))
    if raw_sockets_permitted():
        assert monitor is not None and monitor.prober.method == "syn"
        await monitor.prober.close()
    else:  # said once, and the watcher runs without probes: never a traceback
        assert monitor is None
        assert "liveness probes are off: SYN probes need a raw socket" in caplog.text


def test_watch_settings_are_checked() -> None:
    for bad in (
        {"probe_method": "ping"},
        {"probe_failures": 0},
        {"hang_threshold_s": 1},
        {"heartbeat_timeout_s": 0},
        {"probe_interval_s": 0},
    ):
        with pytest.raises(ValueError):
            WatchSettings.model_validate(bad)


async def test_agents_falling_silent_together_are_the_file_system_not_the_nodes(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    names = ["n1", "n2", "n3", "n4"]
    files = {n: tmp_path / "nodes" / n / "telemetry.jsonl" for n in names}
    scheduler = FakeScheduler()
    scheduler.jobs = [job("101", names, tmp_path / "101.out")]
    watcher = watcher_for(scheduler, tmp_path)
    for second in range(0, 20, 5):
        for path in files.values():
            beat(path, T0 + timedelta(seconds=second))
        assert await watcher.poll_once(T0 + timedelta(seconds=second)) == []
    # One agent goes quiet while the others beat on: that node is reported.
    found = []
    for second in range(20, 45, 5):
        for name in ("n1", "n2", "n3"):
            beat(files[name], T0 + timedelta(seconds=second))
        found += await watcher.poll_once(T0 + timedelta(seconds=second))
    assert [(d.kind, d.nodes) for d in found] == [("heartbeat_lost", ["n4"])]
    # Then every file stops changing in the same poll (the shared file system stalls): that
    # is not four dead nodes, and nothing more is reported.
    with caplog.at_level(logging.WARNING):
        assert await watcher.poll_once(T0 + timedelta(seconds=80)) == []
        assert await watcher.poll_once(T0 + timedelta(seconds=81)) == []
    assert caplog.text.count("went stale together") == 1
