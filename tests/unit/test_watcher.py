"""The watcher against a fake scheduler (real Job/Node models) and real log files."""

from __future__ import annotations

import asyncio
import collections
import os
import time
from collections import Counter
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from relaunch.connectors.logs import FileTail
from relaunch.detection.signatures import Catalogue, ScanStats, SignatureMatch
from relaunch.models.errors import ControllerUnavailableError
from relaunch.models.node_decision import NodeReport
from relaunch.models.recovery import Detection, DetectionSource
from relaunch.models.scheduler import Job, JobState, Node, NodeFlag, NodeState
from relaunch.workers.watch_handover import NodeReports
from relaunch.workers.watcher import WatchConfig, Watcher

T0 = datetime(2026, 2, 20, 9, 0, 0, tzinfo=UTC)
XID_79 = "[155044.078590] NVRM: Xid (PCI:0000:06:00): 79, GPU has fallen off the bus.\n"


class FakeScheduler:
    """Returns the jobs and nodes a test sets, and counts the calls."""

    def __init__(self) -> None:
        self.jobs: list[Job] = []
        self.nodes: list[Node] = [Node(name=n, state=NodeState.ALLOCATED) for n in ("n1", "n2")]
        self.calls: Counter[str] = Counter()
        self.failures: list[Exception] = []

    async def list_jobs(self) -> list[Job]:
        self.calls["list_jobs"] += 1
        if self.failures:
            raise self.failures.pop(0)
        return [job.model_copy(deep=True) for job in self.jobs]

    async def list_nodes(self) -> list[Node]:
        self.calls["list_nodes"] += 1
        return [node.model_copy(deep=True) for node in self.nodes]

    def set_node(self, name: str, **changes: object) -> None:
        self.nodes = [n.model_copy(update=changes) if n.name == name else n for n in self.nodes]

    def set_job(self, **changes: object) -> None:
        self.jobs = [job.model_copy(update=changes) for job in self.jobs]


class SpyCatalogue(Catalogue):
    """The real catalogue, remembering every line it was asked to scan."""

    def __init__(self) -> None:
        super().__init__(Catalogue.load().signatures)
        self.scanned: list[str] = []

    def scan_lines(
        self,
        lines: Iterable[tuple[int, str]],
        *,
        source: str,
        source_node: str | None = None,
        stats: ScanStats | None = None,
    ) -> list[SignatureMatch]:
        numbered = list(lines)
        self.scanned.extend(text for _, text in numbered)
        return super().scan_lines(numbered, source=source, source_node=source_node, stats=stats)


async def ignore(_: Detection) -> None:
    return None


@pytest.fixture
def log(tmp_path: Path) -> Path:
    return tmp_path / "job-101.out"


@pytest.fixture
def scheduler(log: Path) -> FakeScheduler:
    fake = FakeScheduler()
    fake.jobs = [
        Job(
            job_id="101",
            user_id=os.getuid(),  # the job's output files are read as the job's user
            group_id=os.getgid(),
            state=JobState.RUNNING,
            partition="debug",
            comment="relaunch=on",
            nodes=["n1", "n2"],
            num_tasks=2,
            stdout_path=str(log),
            stderr_path=str(log),
        )
    ]
    return fake


def make_watcher(scheduler: FakeScheduler, tmp_path: Path, **config: object) -> Watcher:
    settings: dict[str, object] = {
        "cluster": "dev",
        "node_log_pattern": str(tmp_path / "nodes" / "{node}" / "kern.log"),
    }
    settings.update(config)
    return Watcher(WatchConfig.model_validate(settings), scheduler, ignore)


def append(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        f.write(text)


def kinds(found: list[Detection]) -> list[str]:
    return [d.kind for d in found]


async def test_abnormal_end_is_reported_once(scheduler: FakeScheduler, tmp_path: Path) -> None:
    watcher = make_watcher(scheduler, tmp_path)
    assert await watcher.poll_once(T0) == []
    scheduler.set_job(state=JobState.NODE_FAIL, end_time=T0)
    (found,) = await watcher.poll_once(T0 + timedelta(seconds=1))
    assert (found.kind, found.source, found.attempt) == (
        "job_state:NODE_FAIL",
        DetectionSource.SCHEDULER,
        0,
    )
    assert found.workflow_id == "relaunch-dev-101-0"
    assert found.detected_at == T0 + timedelta(seconds=1)
    assert found.fault_time == T0
    assert await watcher.poll_once(T0 + timedelta(seconds=2)) == []


async def test_a_queued_job_stays_watched_and_its_changes_are_seen_without_a_pass_of_its_own(
    scheduler: FakeScheduler, tmp_path: Path
) -> None:
    """A queued job that never ran and did not change costs a lookup per listing (no pass of
    its own); it is still followed: its fresh snapshot is kept, and a requeue of the queued job
    or its start is seen as for any job."""
    scheduler.set_job(state=JobState.PENDING, nodes=[], reason="Priority")
    watcher = make_watcher(scheduler, tmp_path)
    assert await watcher.poll_once(T0) == []
    scheduler.set_job(reason="Resources")
    assert await watcher.poll_once(T0) == []
    assert watcher._jobs["101"].job.reason == "Resources"
    scheduler.set_job(restart_count=1)  # requeued while queued (scontrol requeue of a held job)
    (found,) = await watcher.poll_once(T0 + timedelta(seconds=1))
    assert (found.kind, found.attempt) == ("job_state:REQUEUED", 0)
    scheduler.set_job(state=JobState.NODE_FAIL, nodes=["n1"], restart_count=1)
    (ended,) = await watcher.poll_once(T0 + timedelta(seconds=2))
    assert (ended.kind, ended.attempt) == ("job_state:NODE_FAIL", 1)


async def test_requeue_by_slurm_names_the_interrupted_attempt(
    scheduler: FakeScheduler, tmp_path: Path
) -> None:
    watcher = make_watcher(scheduler, tmp_path)
    await watcher.poll_once(T0)
    scheduler.set_job(state=JobState.PENDING, restart_count=1, nodes=[])
    (found,) = await watcher.poll_once(T0 + timedelta(seconds=1))
    assert (found.kind, found.attempt) == ("job_state:REQUEUED", 0)
    assert await watcher.poll_once(T0 + timedelta(seconds=2)) == []


async def test_a_requeue_reports_the_interrupted_attempts_submit_time(
    scheduler: FakeScheduler, tmp_path: Path
) -> None:
    """Slurm gives a requeued job a new submit time; the detection of the attempt it interrupted
    keeps the old one, or it would look like a later job given the same id (a second recovery)."""
    scheduler.set_job(submit_time=T0 - timedelta(minutes=5))
    watcher = make_watcher(scheduler, tmp_path)
    await watcher.poll_once(T0)
    scheduler.set_job(state=JobState.PENDING, restart_count=1, nodes=[], submit_time=T0)
    (found,) = await watcher.poll_once(T0 + timedelta(seconds=1))
    assert (found.attempt, found.submitted_at) == (0, T0 - timedelta(minutes=5))
    scheduler.set_job(state=JobState.FAILED, restart_count=1)
    (later,) = await watcher.poll_once(T0 + timedelta(seconds=2))
    assert (later.attempt, later.submitted_at) == (1, T0)


async def test_node_down_and_not_responding(scheduler: FakeScheduler, tmp_path: Path) -> None:
    watcher = make_watcher(scheduler, tmp_path)
    await watcher.poll_once(T0)
    scheduler.set_node("n2", flags=["NOT_RESPONDING"], reason="Not responding")
    (found,) = await watcher.poll_once(T0)
    assert (found.kind, found.nodes) == ("node_state:NOT_RESPONDING", ["n2"])
    scheduler.set_node("n2", state=NodeState.DOWN)
    (found,) = await watcher.poll_once(T0)
    assert (found.kind, found.nodes, found.attempt) == ("node_state:DOWN", ["n2"], 0)
    assert "Not responding" in found.text


async def test_a_foreign_drain_is_reported_and_ours_is_not(
    scheduler: FakeScheduler, tmp_path: Path
) -> None:
    watcher = make_watcher(scheduler, tmp_path)
    await watcher.poll_once(T0)
    scheduler.set_node("n1", flags=["DRAIN"], reason="relaunch: xid_79 incident dev-101-0")
    scheduler.set_node("n2", flags=["DRAIN"], reason="admin: bad fan")
    (found,) = await watcher.poll_once(T0)
    assert (found.kind, found.nodes) == ("node_state:DRAIN", ["n2"])
    assert await watcher.poll_once(T0) == []


async def test_a_node_already_draining_when_first_seen_is_not_news(
    scheduler: FakeScheduler, tmp_path: Path
) -> None:
    scheduler.set_node("n2", flags=["DRAIN"], reason="maintenance after this job")
    watcher = make_watcher(scheduler, tmp_path)
    assert await watcher.poll_once(T0) == []


async def test_only_appended_bytes_are_read(
    scheduler: FakeScheduler, tmp_path: Path, log: Path
) -> None:
    catalogue = SpyCatalogue()
    watcher = Watcher(WatchConfig(cluster="dev"), scheduler, ignore, catalogue=catalogue)
    append(log, "0: step=1 loss=1 rank=0 node=n1\n1: step=1 loss=1 rank=1 node=n2\n")
    assert await watcher.poll_once(T0) == []
    assert len(catalogue.scanned) == 2
    assert await watcher.poll_once(T0) == []
    assert len(catalogue.scanned) == 2  # nothing new, nothing scanned again
    # A signature arrives between polls, its line first without its newline.
    append(log, "1: RuntimeError: CUDA error: uncorrectable ECC error encountered")
    assert await watcher.poll_once(T0) == []
    append(log, "\n0: step=2 loss=1 rank=0 node=n1\n")
    (found,) = await watcher.poll_once(T0)
    assert catalogue.scanned[2:] == [
        "1: RuntimeError: CUDA error: uncorrectable ECC error encountered",
        "0: step=2 loss=1 rank=0 node=n1",
    ]
    assert (found.source, found.kind, found.signature) == (
        DetectionSource.JOB_LOG,
        "signature:cuda_ecc",
        "cuda_ecc",
    )
    assert found.nodes == ["n2"]  # srun task 1 of one task per node
    assert found.text.startswith("1: RuntimeError")


async def test_cascades_are_reported_without_blaming_the_reporter(
    scheduler: FakeScheduler, tmp_path: Path, log: Path
) -> None:
    watcher = make_watcher(scheduler, tmp_path)
    await watcher.poll_once(T0)
    gloo = (
        "0: [rank0]: RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/"
        "pair.cc:553] Connection closed by peer [127.0.0.1]:8616.\n"
    )
    append(log, gloo + "0: [rank0]: Traceback (most recent call last):\n")
    (found,) = await watcher.poll_once(T0)
    assert (found.kind, found.nodes) == ("signature:gloo_connection_lost", [])


async def test_teardown_lines_are_not_reported(
    scheduler: FakeScheduler, tmp_path: Path, log: Path
) -> None:
    watcher = make_watcher(scheduler, tmp_path)
    append(log, "srun: error: n1: task 0: Exited with exit code 1\n")
    assert await watcher.poll_once(T0) == []


async def test_slurm_lines_carry_their_own_time(
    scheduler: FakeScheduler, tmp_path: Path, log: Path
) -> None:
    watcher = make_watcher(scheduler, tmp_path)
    line = (
        "slurmstepd: error: *** JOB 101 ON n1 CANCELLED AT 2026-02-20T09:10:13 DUE TO TIME "
        "LIMIT ***\n"
    )
    append(log, line)
    # Read after the time the line states (a job line stamped in the future states nothing).
    (found,) = await watcher.poll_once(T0 + timedelta(minutes=11))
    assert found.kind == "signature:slurm_time_limit"
    assert found.fault_time == datetime(2026, 2, 20, 9, 10, 13).astimezone(UTC)


async def test_kernel_log_xid_on_one_node(scheduler: FakeScheduler, tmp_path: Path) -> None:
    n1_log = tmp_path / "nodes" / "n1" / "kern.log"
    n2_log = tmp_path / "nodes" / "n2" / "kern.log"
    append(n1_log, XID_79)  # before the job was watched: not this job's problem
    watcher = make_watcher(scheduler, tmp_path)
    assert await watcher.poll_once(T0) == []
    append(n2_log, "[155044.070000] NVRM: loading NVIDIA UNIX x86_64 Kernel Module\n" + XID_79)
    (found,) = await watcher.poll_once(T0)
    assert (found.source, found.kind, found.signature, found.nodes) == (
        DetectionSource.NODE_LOG,
        "signature:xid_79",
        "xid_79",
        ["n2"],
    )
    append(n2_log, XID_79)
    assert await watcher.poll_once(T0) == []  # same attempt, same kind, same node
    append(n2_log, XID_79.replace("79, GPU has fallen off the bus", "48, DBE"))
    (found,) = await watcher.poll_once(T0)  # only what was appended is news
    assert (found.kind, found.nodes) == ("signature:xid_48", ["n2"])


async def test_a_job_that_completed_takes_no_news_from_its_old_nodes(
    scheduler: FakeScheduler, tmp_path: Path
) -> None:
    """A job that ended well is still listed for MinJobAge; a fault its old node reports after
    it is not its own: no detection (no recovery under its name, no drain in its name)."""
    n2_log = tmp_path / "nodes" / "n2" / "kern.log"
    append(n2_log, "")
    watcher = make_watcher(scheduler, tmp_path)
    assert await watcher.poll_once(T0) == []  # the job runs on n1, n2: their logs are opened
    scheduler.set_job(state=JobState.COMPLETED, end_time=T0)
    assert await watcher.poll_once(T0) == []
    append(n2_log, XID_79)
    assert await watcher.poll_once(T0) == []
    # Ended badly, the same line is its news (a fault read just after the job died of it).
    scheduler.set_job(state=JobState.FAILED, end_time=T0)
    append(n2_log, XID_79.replace("79, GPU has fallen off the bus", "48, DBE"))
    kinds = [d.kind for d in await watcher.poll_once(T0)]
    assert "signature:xid_48" in kinds


async def test_an_xid_the_catalogue_ignores_raises_nothing(
    scheduler: FakeScheduler, tmp_path: Path
) -> None:
    """Issue 19: Xid 63 (a row marked for remapping), 92 (single-bit ECC rate) and an NVLink5
    error the decode sheet calls non-fatal are context, not interruptions; an NVLink5 error it
    calls fatal is one."""
    n2_log = tmp_path / "nodes" / "n2" / "kern.log"
    watcher = make_watcher(scheduler, tmp_path)
    assert await watcher.poll_once(T0) == []
    append(
        n2_log,
        "NVRM: Xid (PCI:0000:10:1c): 63, pid=1896, Row Remapper: New row marked for remapping\n"
        "NVRM: Xid (PCI:0000:10:1c): 92, pid=1896, High single-bit ECC error rate\n"
        "NVRM: Xid (PCI:0018:01:00): 145, RLW_REMAP Nonfatal XC0 i0 Link 10 "
        "(0x00000082 0x00000100 0x0 0x0 0x0 0x0)\n",
    )
    assert await watcher.poll_once(T0) == []
    append(
        n2_log,
        "NVRM: Xid (PCI:0018:01:00): 145, RLW_REMAP Fatal XC1 i0 Link 10 "
        "(0x00000082 0x00000040 0x0 0x0 0x0 0x0)\n",
    )
    (found,) = await watcher.poll_once(T0)
    assert (found.kind, found.nodes) == ("signature:xid_145", ["n2"])


def reporting_watcher(scheduler: FakeScheduler, tmp_path: Path) -> tuple[Watcher, list[NodeReport]]:
    """A watcher of the nodes' kernel logs under ``tmp_path``, and the node reports it makes."""
    reports: list[NodeReport] = []

    async def on_node_report(report: NodeReport) -> None:
        reports.append(report)

    config = WatchConfig(
        cluster="dev", node_log_pattern=str(tmp_path / "nodes" / "{node}" / "kern.log")
    )
    return Watcher(config, scheduler, ignore, on_node_report=on_node_report), reports


async def test_a_node_whose_kernel_log_has_a_draining_xid_is_reported_once(
    scheduler: FakeScheduler, tmp_path: Path
) -> None:
    """The node's own kernel log (trusted) with an Xid the catalogue drains for: the node is
    reported to its node decision, once; an Xid the catalogue restarts
    the application for (13, a user's bug) reports nothing, and neither does a job's output."""
    watcher, reports = reporting_watcher(scheduler, tmp_path)
    assert await watcher.poll_once(T0) == []
    append(tmp_path / "nodes" / "n1" / "kern.log", XID_79.replace("79,", "13,", 1))
    append(Path(scheduler.jobs[0].stdout_path), XID_79)  # the job's own say-so
    found = watcher.read_logs_once(T0)
    await watcher._reports.report(found)
    await watcher._deliver(collections.deque(found))
    assert reports == []
    append(tmp_path / "nodes" / "n2" / "kern.log", XID_79)
    found = watcher.read_logs_once(T0)
    assert ("signature:xid_79", ["n2"]) in [(d.kind, d.nodes) for d in found]
    await watcher._reports.report(found)
    await watcher._deliver(collections.deque(found))
    [report] = reports
    assert (report.node, report.source, report.kind, report.remedy) == (
        "n2",
        DetectionSource.NODE_LOG,
        "signature:xid_79",
        "reboot",
    )
    assert (report.jobs, report.partitions) == (1, ["debug"])
    assert "fallen off the bus" in report.text
    append(tmp_path / "nodes" / "n2" / "kern.log", XID_79)  # the same failure, said again
    await watcher._reports.report(watcher.read_logs_once(T0))
    assert len(reports) == 1


async def test_a_job_listed_failed_before_its_nodes_xid_still_sets_the_reports_partition(
    scheduler: FakeScheduler, tmp_path: Path
) -> None:
    """The Xid that killed a job can reach the watcher after the job was listed FAILED. The
    report still counts that job: its partition sets the decision's mode (a canary partition
    acts alone; a report without it waited for a person). It is not requeued ahead: its own
    recovery has it. A job that ended there long before is not counted."""
    watcher, reports = reporting_watcher(scheduler, tmp_path)
    assert await watcher.poll_once(T0) == []
    old = scheduler.jobs[0].model_copy(
        update={
            "job_id": "102",
            "state": JobState.FAILED,
            "partition": "long-gone",
            "end_time": datetime.now(UTC) - timedelta(minutes=10),
        }
    )
    scheduler.jobs[0] = scheduler.jobs[0].model_copy(
        update={"state": JobState.FAILED, "end_time": datetime.now(UTC)}
    )
    scheduler.jobs.append(old)
    found = await watcher.poll_once(T0)
    assert "job_state:FAILED" in [d.kind for d in found]
    append(tmp_path / "nodes" / "n2" / "kern.log", XID_79)
    await watcher._reports.report(watcher.read_logs_once(T0))
    [report] = reports
    assert (report.node, report.jobs, report.partitions) == ("n2", 1, ["debug"])
    assert report.running == []


async def test_a_report_lists_the_jobs_no_other_reported_node_runs() -> None:
    """The jobs a node's decision may requeue ahead of their joins: its watched jobs on no
    other node reported now or lately, so that no two decisions requeue one job."""
    jobs = [
        Job(job_id="1", state=JobState.RUNNING, nodes=["n1"], partition="gpu", restart_count=2),
        Job(job_id="2", state=JobState.RUNNING, nodes=["n1", "n2"]),  # both fail together
        Job(job_id="3", state=JobState.RUNNING, nodes=["n1", "n9"]),  # n9 fails later
        Job(job_id="4", state=JobState.RUNNING, nodes=["n9"], comment="relaunch=on,max_restarts=1"),
    ]
    reports: list[NodeReport] = []

    async def on_node_report(report: NodeReport) -> None:
        reports.append(report)

    def running_on(node: str) -> list[Job]:
        return [j for j in jobs if node in j.nodes]

    def down(*nodes: str) -> list[Detection]:
        return [
            Detection(
                cluster="dev",
                job_id=j.job_id,
                attempt=j.restart_count,
                source=DetectionSource.PROBE,
                kind="node_unreachable",
                nodes=[n],
                detected_at=T0,
                text=f"{n} slurmd: refused",
            )
            for n in nodes
            for j in running_on(n)
        ]

    handover = NodeReports(on_node_report, running_on)
    await handover.report(down("n1", "n2"))
    listed = {r.node: [(j.job_id, j.restart_count) for j in r.running] for r in reports}
    assert listed == {"n1": [("1", 2), ("3", 0)], "n2": []}
    assert (reports[0].jobs, reports[1].jobs) == (3, 1)  # every watched job still counts
    await handover.report(down("n9"))
    [n9] = reports[2:]
    assert [(j.job_id, j.max_restarts) for j in n9.running] == [("4", 1)]  # job 3 is n1's


async def test_the_handover_waits_for_the_node_reports_made_with_it(
    scheduler: FakeScheduler, tmp_path: Path
) -> None:
    """A node's report goes out before the hundreds of recoveries its failure starts: the
    decision drains the node while their starts still queue at the server."""
    order: list[str] = []

    async def on_node_report(report: NodeReport) -> None:
        await asyncio.sleep(0.3)  # a slow round trip: the handover still waits for it
        order.append(f"report {report.node}")

    async def on_detection(det: Detection) -> None:
        order.append(f"recovery {det.job_id}")

    config = WatchConfig(
        cluster="dev",
        node_log_pattern=str(tmp_path / "nodes" / "{node}" / "kern.log"),
        poll_interval_s=0.2,
        log_interval_s=0.1,
    )
    watcher = Watcher(config, scheduler, on_detection, on_node_report=on_node_report)
    stop = asyncio.Event()
    task = asyncio.create_task(watcher.run(stop))
    await asyncio.sleep(0.5)
    append(tmp_path / "nodes" / "n2" / "kern.log", XID_79)
    for _ in range(50):
        if any(o.startswith("recovery") for o in order):
            break
        await asyncio.sleep(0.1)
    stop.set()
    await task
    assert order and order[0] == "report n2", order


def more_jobs(
    scheduler: FakeScheduler, order: list[str], watcher: Watcher, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Nine more jobs on n3 (102–110), listed before job 101 (on n1 and n2): a pass reads n2's
    job last. Each job's log read is recorded."""
    first = scheduler.jobs[0]
    scheduler.jobs[:0] = [
        first.model_copy(update={"job_id": str(job_id), "nodes": ["n3"]})
        for job_id in range(102, 111)
    ]
    job_logs = watcher._job_logs

    def reading(poll: Any) -> None:
        order.append(f"job {poll.job.job_id}")
        job_logs(poll)

    monkeypatch.setattr(watcher, "_job_logs", reading)


A_PASS = [f"job {job_id}" for job_id in range(102, 111)] + ["job 101"]


async def test_a_kernel_log_report_goes_out_before_a_log_pass_reads_any_job(
    scheduler: FakeScheduler, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A log pass reads the nodes' own kernel logs first: a node's Xid is reported before the
    pass reads any job's log, not when it reaches the node's first job (seconds later, over
    hundreds of jobs on a busy machine)."""
    order: list[str] = []

    async def on_node_report(report: NodeReport) -> None:
        order.append(f"report {report.node}")

    config = WatchConfig(
        cluster="dev", node_log_pattern=str(tmp_path / "nodes" / "{node}" / "kern.log")
    )
    watcher = Watcher(config, scheduler, ignore, on_node_report=on_node_report)
    more_jobs(scheduler, order, watcher, monkeypatch)
    assert await watcher.poll_once(T0) == []
    order.clear()
    append(tmp_path / "nodes" / "n2" / "kern.log", XID_79)
    found = await watcher.read_logs()
    assert ("signature:xid_79", ["n2"]) in [(d.kind, d.nodes) for d in found]
    assert order == ["report n2", *A_PASS], order


async def test_a_polls_kernel_log_report_goes_out_before_it_reads_any_job(
    scheduler: FakeScheduler, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same in a poll's pass."""
    order: list[str] = []

    async def on_node_report(report: NodeReport) -> None:
        order.append(f"report {report.node}")

    config = WatchConfig(
        cluster="dev", node_log_pattern=str(tmp_path / "nodes" / "{node}" / "kern.log")
    )
    watcher = Watcher(config, scheduler, ignore, on_node_report=on_node_report)
    more_jobs(scheduler, order, watcher, monkeypatch)
    assert await watcher.poll_once(T0) == []
    order.clear()
    append(tmp_path / "nodes" / "n2" / "kern.log", XID_79)
    found = await watcher.poll_once(T0)
    assert ("signature:xid_79", ["n2"]) in [(d.kind, d.nodes) for d in found]
    assert order == ["report n2", *A_PASS], order


async def test_a_long_pass_lets_the_handover_run(
    scheduler: FakeScheduler, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pass over many jobs gives the event loop back every PASS_SLICE_S: the handover of what
    an earlier pass found and the liveness probes run while it reads (here: a task scheduled
    before the pass runs while the pass is still reading)."""
    order: list[str] = []
    watcher = Watcher(WatchConfig(cluster="dev"), scheduler, ignore)
    more_jobs(scheduler, order, watcher, monkeypatch)
    assert await watcher.poll_once(T0) == []
    job_logs = watcher._job_logs

    def slow(poll: Any) -> None:
        time.sleep(0.03)
        job_logs(poll)

    monkeypatch.setattr(watcher, "_job_logs", slow)

    async def beside() -> None:
        order.append("beside")

    order.clear()
    task = asyncio.create_task(beside())
    await watcher.read_logs()
    await task
    assert order[0] != "beside" and order[-1] != "beside", order
    order.clear()
    task = asyncio.create_task(beside())
    await watcher.poll_once(T0)
    await task
    assert order[0] != "beside" and order[-1] != "beside", order


async def test_later_signs_of_a_handed_over_interruption_are_held_and_handed_over_together(
    scheduler: FakeScheduler, tmp_path: Path
) -> None:
    """The first sign starts the recovery at once; the later ones (here Slurm's job state, then
    a node state) are held for follow_up_hold_s and handed over in one signal, none lost."""
    first: list[str] = []
    together: list[list[str]] = []

    async def on_detection(det: Detection) -> None:
        first.append(det.kind)

    async def on_follow_ups(dets: list[Detection]) -> None:
        together.append([d.kind for d in dets])

    config = WatchConfig(
        cluster="dev",
        node_log_pattern=str(tmp_path / "nodes" / "{node}" / "kern.log"),
        follow_up_hold_s=0.3,
    )
    watcher = Watcher(config, scheduler, on_detection, on_follow_ups=on_follow_ups)
    assert await watcher.poll_once(T0) == []
    append(tmp_path / "nodes" / "n2" / "kern.log", XID_79)
    pending = collections.deque(watcher.read_logs_once(T0))
    await watcher._deliver(pending)
    assert first == ["signature:xid_79"] and not pending
    scheduler.set_node("n2", flags=[NodeFlag.NOT_RESPONDING])
    pending.extend(await watcher.poll_once(T0))
    await watcher._deliver(pending)
    assert not pending and together == []  # held, not lost: it left the pending queue
    scheduler.set_job(state=JobState.NODE_FAIL, end_time=T0)
    pending.extend(await watcher.poll_once(T0))
    await watcher._deliver(pending)
    assert together == []
    await asyncio.sleep(0.35)
    await watcher._deliver(pending)
    assert together == [["node_state:NOT_RESPONDING", "job_state:NODE_FAIL"]]
    assert first == ["signature:xid_79"]
    # When the watcher stops, whatever is held is handed over at once.
    scheduler.set_job(state=JobState.RUNNING)
    scheduler.set_job(restart_count=1, state=JobState.PENDING)
    pending.extend(await watcher.poll_once(T0))
    await watcher._deliver(pending, final=True)
    assert together[-1] == ["job_state:REQUEUED"]


async def test_a_node_log_is_read_once_per_pass_for_all_its_jobs(
    scheduler: FakeScheduler, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Hundreds of jobs share a node in a burst: its kernel log is read (and scanned) once per
    pass, every job on it gets the Xid, and a job first seen after the line was written is
    not charged with it."""
    base = scheduler.jobs[0]
    scheduler.jobs = [
        base.model_copy(update={"job_id": str(500 + i), "nodes": ["n3"], "num_tasks": 1})
        for i in range(50)
    ]
    n3_log = tmp_path / "nodes" / "n3" / "kern.log"
    append(n3_log, "boot\n")
    reads: list[str] = []
    real_read = FileTail.read

    def counted(self: FileTail) -> bytes:
        reads.append(self.path)
        return real_read(self)

    monkeypatch.setattr(FileTail, "read", counted)
    watcher = make_watcher(scheduler, tmp_path)
    assert await watcher.poll_once(T0) == []
    reads.clear()
    append(n3_log, XID_79)
    found = watcher.read_logs_once(T0)
    assert reads.count(str(n3_log)) == 1
    assert sorted(d.job_id for d in found) == sorted(j.job_id for j in scheduler.jobs)
    assert {(d.kind, tuple(d.nodes)) for d in found} == {("signature:xid_79", ("n3",))}
    late = base.model_copy(update={"job_id": "600", "nodes": ["n3"], "num_tasks": 1})
    scheduler.jobs.append(late)
    append(n3_log, XID_79.replace("79", "48", 1))  # lands before job 600 is first seen
    found = await watcher.poll_once(T0)
    assert "600" not in {d.job_id for d in found}
    append(n3_log, XID_79.replace("79", "48", 1))
    assert "600" in {d.job_id for d in watcher.read_logs_once(T0)}


async def test_hang_after_the_threshold(
    scheduler: FakeScheduler, tmp_path: Path, log: Path
) -> None:
    watcher = make_watcher(scheduler, tmp_path, hang_threshold_s=120)
    for second in range(5):
        append(log, f"0: step={second} loss=1 rank=0 node=n1\n1: step={second} loss=1 rank=1\n")
        assert await watcher.poll_once(T0 + timedelta(seconds=second)) == []
    last_progress = T0 + timedelta(seconds=4)
    assert await watcher.poll_once(last_progress + timedelta(seconds=119)) == []
    (found,) = await watcher.poll_once(last_progress + timedelta(seconds=121))
    assert (found.source, found.kind, found.nodes) == (DetectionSource.PROGRESS, "hang", [])
    assert found.fault_time == last_progress
    assert await watcher.poll_once(last_progress + timedelta(seconds=300)) == []


@pytest.mark.parametrize(("lag_floor", "seen_at"), [(None, 20), (30.0, 40)])
async def test_a_rank_left_behind_names_its_node(
    scheduler: FakeScheduler, tmp_path: Path, log: Path, lag_floor: float | None, seen_at: int
) -> None:
    # Steps come every second: by default a rank lags after max(5 s, 10 x 1 s) = 10 s; a
    # lag floor of 30 s makes it 30 s.
    settings = {} if lag_floor is None else {"lag_floor_s": lag_floor}
    watcher = make_watcher(scheduler, tmp_path, **settings)
    for second in range(60):
        line = f"0: step={second} loss=1 rank=0 node=n1\n"
        if second < 10:
            line += f"1: step={second} loss=1 rank=1 node=n2\n"
        append(log, line)
        found = await watcher.poll_once(T0 + timedelta(seconds=second))
        if found:
            break
    assert (found[0].kind, found[0].nodes) == ("progress_stalled_rank", ["n2"])
    assert second == seen_at  # rank 1 last advanced at 9 s


async def test_unwatched_jobs_are_ignored(
    scheduler: FakeScheduler, tmp_path: Path, log: Path
) -> None:
    scheduler.set_job(comment="", state=JobState.FAILED)
    watcher = make_watcher(scheduler, tmp_path, partitions=["gpu"])
    assert await watcher.poll_once(T0) == []
    assert scheduler.calls == {"list_jobs": 1}  # no running watched job: no node read
    assert watcher.stats.watched_jobs == 0
    # The partition allowlist watches it without a comment...
    scheduler.set_job(partition="gpu")
    assert kinds(await watcher.poll_once(T0)) == ["job_state:FAILED"]
    # ...and relaunch=off always opts out.
    scheduler.set_job(comment="relaunch=off")
    assert not watcher.watches(scheduler.jobs[0])
    opted_out = make_watcher(scheduler, tmp_path, partitions=["gpu"], opt_in_comment=False)
    scheduler.set_job(partition="debug", comment="relaunch=on")
    assert await opted_out.poll_once(T0) == []
    # A job that names another Relaunch deployment is that one's, whatever else it says.
    scheduler.set_job(partition="gpu", comment="relaunch=on,relaunch_cluster=staging")
    assert not watcher.watches(scheduler.jobs[0])
    scheduler.set_job(comment="relaunch=on,relaunch_cluster=dev")
    assert watcher.watches(scheduler.jobs[0])


async def test_one_batched_read_of_each_kind_per_poll(
    scheduler: FakeScheduler, tmp_path: Path
) -> None:
    second = scheduler.jobs[0].model_copy(update={"job_id": "102", "stdout_path": ""})
    scheduler.jobs.append(second)
    watcher = make_watcher(scheduler, tmp_path)
    await watcher.poll_once(T0)
    await watcher.poll_once(T0)
    assert scheduler.calls == {"list_jobs": 2, "list_nodes": 2}
    assert watcher.stats.polls == 2
    assert watcher.stats.watched_jobs == 2


async def test_jobs_gone_from_squeue_are_forgotten(
    scheduler: FakeScheduler, tmp_path: Path, log: Path
) -> None:
    append(log, "0: step=1 loss=1\n")
    watcher = make_watcher(scheduler, tmp_path)
    await watcher.poll_once(T0)
    assert watcher.stats.watched_jobs == 1
    scheduler.jobs = []
    await watcher.poll_once(T0)
    assert watcher.stats.watched_jobs == 0


async def test_a_requeued_job_keeps_its_offset_and_old_lines_stay_old(
    scheduler: FakeScheduler, tmp_path: Path, log: Path
) -> None:
    append(log, "1: RuntimeError: CUDA error: uncorrectable ECC error encountered\n")
    scheduler.set_job(restart_count=2)  # first seen on its third attempt
    watcher = make_watcher(scheduler, tmp_path)
    assert await watcher.poll_once(T0) == []  # earlier attempts' lines are not this attempt's
    scheduler.set_job(state=JobState.PENDING, restart_count=3)
    append(log, "0: resumed from checkpoint step=40\n")
    assert kinds(await watcher.poll_once(T0)) == ["job_state:REQUEUED"]
    scheduler.set_job(state=JobState.RUNNING)
    append(log, "0: RuntimeError: loss is nan\n")
    (found,) = await watcher.poll_once(T0)
    assert (found.kind, found.attempt, found.nodes) == ("signature:python_exception", 3, ["n1"])


async def test_run_survives_a_controller_outage_and_retries_delivery(
    scheduler: FakeScheduler, tmp_path: Path
) -> None:
    scheduler.failures = [ControllerUnavailableError("slurmctld down")]
    scheduler.set_job(state=JobState.FAILED)
    delivered: list[Detection] = []
    stop = asyncio.Event()
    attempts = 0

    async def deliver(detection: Detection) -> None:
        nonlocal attempts
        attempts += 1
        if attempts == 1:
            raise ConnectionError("temporal briefly away")
        delivered.append(detection)
        stop.set()

    config = WatchConfig(cluster="dev", poll_interval_s=0.01)
    watcher = Watcher(config, scheduler, deliver)
    await asyncio.wait_for(watcher.run(stop), timeout=5)
    assert kinds(delivered) == ["job_state:FAILED"]
    assert watcher.stats.errors == 1
    assert "slurmctld down" in watcher.stats.last_error


async def test_a_burst_is_handed_over_in_parallel_each_recovery_in_order(
    scheduler: FakeScheduler, tmp_path: Path
) -> None:
    """A rack failure interrupts many jobs at once: their recoveries are started side by side
    (bounded), while one recovery's detections still arrive in the order they were made."""
    base = scheduler.jobs[0]
    scheduler.jobs = [
        base.model_copy(update={"job_id": str(200 + i), "state": JobState.FAILED})
        for i in range(40)
    ]
    in_flight = peak = 0
    delivered: list[Detection] = []
    stop = asyncio.Event()

    async def deliver(detection: Detection) -> None:
        nonlocal in_flight, peak
        in_flight += 1
        peak = max(peak, in_flight)
        await asyncio.sleep(0.05)  # a round trip to Temporal
        in_flight -= 1
        delivered.append(detection)
        if len(delivered) == 80:
            stop.set()

    watcher = Watcher(
        WatchConfig(cluster="dev", poll_interval_s=0.01, deliver_parallel=8), scheduler, deliver
    )
    # Each job also gets a second detection (its node went down) after the first.
    pending = [*await watcher.poll_once(T0)]
    scheduler.nodes = [Node(name="n1", state=NodeState.DOWN), *scheduler.nodes[1:]]
    for job in scheduler.jobs:
        job.state = JobState.RUNNING
    pending += await watcher.poll_once(T0)
    assert len(pending) == 80
    started = asyncio.get_running_loop().time()
    await asyncio.wait_for(watcher._deliver(collections.deque(pending)), timeout=5)
    took = asyncio.get_running_loop().time() - started
    assert peak == 8  # parallel, and never more than deliver_parallel at once
    assert took < 80 * 0.05 / 2  # far less than one at a time
    for job in scheduler.jobs:
        mine = [d.kind for d in delivered if d.job_id == job.job_id]
        assert mine == ["job_state:FAILED", "node_state:DOWN"]


async def test_a_slow_handover_does_not_hold_up_detection(
    scheduler: FakeScheduler, tmp_path: Path, log: Path
) -> None:
    """Temporal answering slowly (a burst, a loaded server) must not delay reading logs."""
    first = scheduler.jobs[0]
    failed = {"job_id": "102", "state": JobState.FAILED, "stdout_path": "", "stderr_path": ""}
    scheduler.jobs.append(first.model_copy(update=failed))
    release = asyncio.Event()
    delivered: list[str] = []

    async def deliver(detection: Detection) -> None:
        await release.wait()
        delivered.append(detection.kind)

    stop = asyncio.Event()
    watcher = Watcher(WatchConfig(cluster="dev", poll_interval_s=0.05), scheduler, deliver)
    running = asyncio.create_task(watcher.run(stop))
    for _ in range(100):
        if watcher.stats.detections:
            break
        await asyncio.sleep(0.01)
    append(log, "0: RuntimeError: CUDA error: uncorrectable ECC error encountered\n")
    for _ in range(100):  # found while the first handover is still waiting
        if watcher.stats.detections == 2:
            break
        await asyncio.sleep(0.01)
    assert watcher.stats.detections == 2 and delivered == []
    release.set()
    for _ in range(100):
        if len(delivered) == 2:
            break
        await asyncio.sleep(0.01)
    stop.set()
    await asyncio.wait_for(running, timeout=5)
    assert sorted(delivered) == ["job_state:FAILED", "signature:cuda_ecc"]


async def test_a_slow_scheduler_listing_does_not_hold_up_log_reading(
    scheduler: FakeScheduler, tmp_path: Path, log: Path
) -> None:
    """squeue taking seconds (a busy controller, thousands of jobs) must not delay reading a
    watched job's log: a line appended while a listing is in flight is found within a log
    interval, and the listing's result is still used when it comes."""
    slow = asyncio.Event()
    listing = scheduler.list_jobs

    async def slow_listing() -> list[Job]:
        jobs = await listing()
        if scheduler.calls["list_jobs"] > 1:
            await slow.wait()  # the second listing hangs until released
        return jobs

    scheduler.list_jobs = slow_listing  # type: ignore[method-assign]
    delivered: list[str] = []

    async def deliver(detection: Detection) -> None:
        delivered.append(detection.kind)

    stop = asyncio.Event()
    config = WatchConfig(cluster="dev", poll_interval_s=0.05, log_interval_s=0.02)
    watcher = Watcher(config, scheduler, deliver)
    running = asyncio.create_task(watcher.run(stop))
    for _ in range(200):
        if scheduler.calls["list_jobs"] >= 2:
            break
        await asyncio.sleep(0.01)
    assert scheduler.calls["list_jobs"] == 2 and watcher.stats.polls == 1  # one stuck poll
    append(log, "0: RuntimeError: CUDA error: uncorrectable ECC error encountered\n")
    for _ in range(100):
        if delivered:
            break
        await asyncio.sleep(0.01)
    assert delivered == ["signature:cuda_ecc"] and watcher.stats.polls == 1
    scheduler.set_job(state=JobState.FAILED)
    slow.set()  # the stuck listing returns; later ones are quick
    for _ in range(200):
        if "job_state:FAILED" in delivered:
            break
        await asyncio.sleep(0.01)
    stop.set()
    await asyncio.wait_for(running, timeout=5)
    assert delivered == ["signature:cuda_ecc", "job_state:FAILED"]
    assert watcher.stats.polls >= 2


async def test_a_failed_handover_keeps_the_rest_pending_in_order(
    scheduler: FakeScheduler,
) -> None:
    base = scheduler.jobs[0]
    scheduler.jobs = [
        base.model_copy(update={"job_id": str(300 + i), "state": JobState.FAILED})
        for i in range(10)
    ]
    calls = 0

    async def deliver(detection: Detection) -> None:
        nonlocal calls
        calls += 1
        if detection.job_id == "300":
            raise ConnectionError("temporal went away")

    watcher = Watcher(WatchConfig(cluster="dev", deliver_parallel=1), scheduler, deliver)
    pending = collections.deque(await watcher.poll_once(T0))
    order = [d.job_id for d in pending]
    await watcher._deliver(pending)
    assert calls == 1  # nothing new is tried once a handover failed
    assert [d.job_id for d in pending] == order  # all kept, in order


def test_file_tail_reads_new_bytes_and_survives_truncation(tmp_path: Path) -> None:
    path = tmp_path / "out.log"
    tail = FileTail(path, max_read=8)
    assert tail.read() == b""  # not there yet
    path.write_bytes(b"0123456789abc")
    assert tail.read() == b"01234567"
    assert tail.read() == b"89abc"
    assert tail.read() == b""
    path.write_bytes(b"new")  # truncated and rewritten
    assert tail.read() == b"new"
    assert tail.truncations == 1
    replacement = tmp_path / "rotated"
    replacement.write_bytes(b"fresh file, longer than before")
    replacement.replace(path)
    assert tail.read() == b"fresh fi"
    assert tail.truncations == 2
    assert FileTail.at_end(path).read() == b""


def test_config_is_checked() -> None:
    with pytest.raises(ValueError, match="node"):
        WatchConfig(cluster="dev", node_log_pattern="/var/log/kern.log")
    with pytest.raises(ValueError):
        WatchConfig(cluster="dev", poll_interval_s=61)
    with pytest.raises(ValueError):
        WatchConfig(cluster="dev", listing_share=0)


async def test_logs_are_read_between_scheduler_polls(
    scheduler: FakeScheduler, log: Path, tmp_path: Path
) -> None:
    watcher = make_watcher(scheduler, tmp_path)
    assert await watcher.poll_once(T0) == []
    polls = dict(scheduler.calls)
    append(log, "0: RuntimeError: boom\n")
    (found,) = watcher.read_logs_once(T0)
    assert found.kind == "signature:python_exception"
    assert dict(scheduler.calls) == polls  # the scheduler was not asked again
    assert watcher.read_logs_once(T0) == []


async def test_telemetry_counter_rise_on_one_gpu(scheduler: FakeScheduler, tmp_path: Path) -> None:
    pattern = str(tmp_path / "nodes" / "{node}" / "telemetry.jsonl")
    n2 = tmp_path / "nodes" / "n2" / "telemetry.jsonl"
    append(n2, '{"node": "n2", "gpu": 3, "ecc_dbe_volatile": 1}\n')  # history: not news
    watcher = make_watcher(scheduler, tmp_path, telemetry_pattern=pattern)
    assert await watcher.poll_once(T0) == []
    append(n2, '{"node": "n2", "gpu": 3, "ecc_dbe_volatile": 1, "throttle": ["hw_thermal"]}\n')
    assert await watcher.poll_once(T0) == []  # a sample, but no counter rose
    append(
        n2, '{"node": "n2", "gpu": 3, "ecc_dbe_volatile": 2}\n{"node": "n2", "gpu": 0, "xid": 63}\n'
    )
    (found,) = await watcher.poll_once(T0)
    assert (found.source, found.kind, found.nodes) == (
        DetectionSource.TELEMETRY,
        "signature:telemetry_memory_error",
        ["n2"],
    )
    assert "ecc_dbe_volatile=2" in found.text
    append(n2, '{"node": "n2", "gpu": 1, "xid": 79}\n')
    (xid,) = await watcher.poll_once(T0)
    assert xid.kind == "signature:xid_79" and xid.nodes == ["n2"]


async def test_a_hostile_hostlist_names_no_node_and_costs_nothing(
    scheduler: FakeScheduler, tmp_path: Path, log: Path
) -> None:
    # Attack row 4: 52 bytes that would expand to a billion host names.
    watcher = make_watcher(scheduler, tmp_path)
    await watcher.poll_once(T0)
    append(log, "srun: error: Node failure on a[0-999][0-999][0-999]\n" * 3)
    started = time.process_time()
    (found,) = await watcher.poll_once(T0 + timedelta(seconds=1))
    assert time.process_time() - started < 1.0
    assert (found.kind, found.nodes) == ("signature:srun_node_failure", [])
    # A genuine fault afterwards is still seen.
    append(log, "srun: error: Node failure on n2\n")
    (found,) = await watcher.poll_once(T0 + timedelta(seconds=2))
    assert (found.kind, found.nodes) == ("signature:srun_node_failure", ["n2"])


async def test_a_flooding_job_does_not_starve_the_others(
    scheduler: FakeScheduler, tmp_path: Path, log: Path
) -> None:
    quiet_log = tmp_path / "job-102.out"
    quiet = scheduler.jobs[0].model_copy(
        update={"job_id": "102", "stdout_path": str(quiet_log), "stderr_path": str(quiet_log)}
    )
    scheduler.jobs.append(quiet)
    watcher = make_watcher(scheduler, tmp_path, max_job_bytes_per_pass=1 << 20)
    await watcher.poll_once(T0)
    flood = "0: gpu1:1:1 [0] NCCL INFO Channel 00/32 : 0[0] -> 1[1] via NET/IB/0\n"
    append(log, flood * (8 * (1 << 20) // len(flood)))  # 8 MiB
    append(log, "1: RuntimeError: CUDA error: uncorrectable ECC error encountered\n")
    append(quiet_log, "0: RuntimeError: CUDA error: uncorrectable ECC error encountered\n")
    found = watcher.read_logs_once(T0)
    # The quiet job's line is seen in the same pass; the flood is read 1 MiB at a time.
    assert [(d.job_id, d.kind) for d in found] == [("102", "signature:cuda_ecc")]
    assert watcher.stats.backlogged == 1
    passes, found = 1, []
    while not found:
        found = watcher.read_logs_once(T0)
        passes += 1
    assert [(d.job_id, d.kind) for d in found] == [("101", "signature:cuda_ecc")]
    assert passes == 9 and watcher.stats.backlogged == 8  # the last pass read all that was left


async def test_long_lines_are_counted_and_hostile_ones_cost_milliseconds(
    scheduler: FakeScheduler, tmp_path: Path, log: Path
) -> None:
    watcher = make_watcher(scheduler, tmp_path)
    await watcher.poll_once(T0)
    append(log, ("mlx5_core " * 16000 + "Segmentation fault\n") * 20)  # 3.2 MB, row 7
    started = time.process_time()
    assert watcher.read_logs_once(T0) == []
    assert time.process_time() - started < 2.0
    assert watcher.stats.long_lines == 20


async def test_progress_keeps_no_more_ranks_than_the_job_has_tasks(
    scheduler: FakeScheduler, tmp_path: Path, log: Path
) -> None:
    watcher = make_watcher(scheduler, tmp_path)
    await watcher.poll_once(T0)
    append(log, "".join(f"step=1 loss=0.1 rank={r} node=n1\n" for r in range(10_000)))
    await watcher.poll_once(T0)
    assert set(watcher._jobs["101"].progress.ranks) == {0, 1}  # num_tasks=2
    assert watcher.stats.ignored_progress == 9_998


async def test_a_job_line_stamped_in_the_future_gives_no_fault_time(
    scheduler: FakeScheduler, tmp_path: Path, log: Path
) -> None:
    watcher = make_watcher(scheduler, tmp_path)
    await watcher.poll_once(T0)
    append(log, "2099-01-01T00:00:00Z 1: CUDA error: uncorrectable ECC error encountered\n")
    (found,) = await watcher.poll_once(T0 + timedelta(seconds=1))
    assert found.kind == "signature:cuda_ecc" and found.fault_time is None


async def test_a_recovery_starts_from_what_the_jobs_user_cannot_write(
    scheduler: FakeScheduler, tmp_path: Path
) -> None:
    """One pass found a job's output line and its node's Xid: the recovery is started with the
    Xid (its evidence reads the node it names, which Slurm may drop from the ending job's
    record), then joined with the job's line; every detection is handed over."""
    order: list[str] = []

    async def on_detection(det: Detection) -> None:
        order.append(f"{det.source.value} {','.join(det.nodes)}")

    watcher = Watcher(
        WatchConfig(
            cluster="dev", node_log_pattern=str(tmp_path / "nodes" / "{node}" / "kern.log")
        ),
        scheduler,
        on_detection,
    )
    assert await watcher.poll_once(T0) == []
    append(Path(scheduler.jobs[0].stdout_path), "srun: error: n2: task 1: Killed\n")
    append(tmp_path / "nodes" / "n2" / "kern.log", XID_79)
    found = watcher.read_logs_once(T0)
    assert found[0].source is DetectionSource.JOB_LOG  # the job's line was read first
    pending = collections.deque(found)
    await watcher._deliver(pending)
    assert order[0] == "node_log n2" and len(order) == len(found) and not pending
