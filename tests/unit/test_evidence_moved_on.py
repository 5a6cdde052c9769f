"""The evidence of a job attempt the job has already moved on from: a node decision requeued it
ahead of its recovery (or Slurm did), and the live record is the next attempt's, on other nodes.
The evidence must stay the failed attempt's: its nodes, their kernel logs around the failure,
its restart count (which every requeue of the recovery then expects, so none repeats it)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import cast

from relaunch.activities.deps import Deps
from relaunch.activities.evidence import EvidenceActivities
from relaunch.connectors.audit import AuditStore
from relaunch.models.config import ClusterConfig
from relaunch.models.recovery import AuditRecord, GatherInput
from relaunch.models.scheduler import Job, JobState, Node, NodeState
from tests.support.fake_scheduler import FakeScheduler
from tests.unit.test_activities import MemoryAudit

XID = "NVRM: Xid (PCI:0000:3b:00): 79, pid=4242, name=python3, GPU has fallen off the bus."


async def gather(tmp_path: Path, job: Job, attempt: int) -> tuple[MemoryAudit, Deps]:
    now = datetime.now(UTC)
    logs = tmp_path / "kern"
    logs.mkdir()
    (logs / "n3.log").write_text(f"{(now - timedelta(seconds=5)).isoformat()} n3 kernel: {XID}\n")
    (logs / "n20.log").write_text(f"{now.isoformat()} n20 kernel: all well\n")
    config = ClusterConfig(
        name="dev",
        database_url="postgresql://unused",
        bundle_dir=str(tmp_path / "bundles"),
        node_log_pattern=str(logs / "{node}.log"),
    )
    sched = FakeScheduler(
        nodes=[Node(name=n, state=NodeState.IDLE) for n in ("n3", "n20")], jobs=[job]
    )
    audit = MemoryAudit()
    await audit.record(
        AuditRecord(
            incident_id=f"relaunch-dev-{job.job_id}-{attempt}",
            kind="detection",
            at=now,
            summary="probe: node_unreachable",
            nodes=["n3"],
        )
    )
    return audit, Deps(config=config, scheduler=sched, audit=cast(AuditStore, audit))


async def test_the_evidence_of_an_attempt_requeued_since_is_that_attempts(tmp_path: Path) -> None:
    # Requeued ahead by n3's node decision and running again on n20 (its restart 1).
    job = Job(
        job_id="31",
        state=JobState.RUNNING,
        nodes=["n20"],
        restart_count=1,
        start_time=datetime.now(UTC),
        requeue_allowed=True,
    )
    audit, deps = await gather(tmp_path, job, attempt=0)
    incident = "relaunch-dev-31-0"
    summary = await EvidenceActivities(deps).gather_evidence(
        GatherInput(incident_id=incident, cluster="dev", job_id="31", attempt=0)
    )
    assert summary.job.nodes == ["n3"] and summary.job.restart_count == 0
    # n3's kernel log around the failure is in the bundle; n20's (the next attempt's) is not.
    nodes = Path(summary.bundle_path) / "nodes"
    assert XID in (nodes / "n3.log").read_text() and not (nodes / "n20.log").exists()
    [row] = [r for r in await audit.events(incident) if r.kind == "evidence"]
    assert "requeued since this attempt (restart 1 now)" in row.summary


async def test_the_evidence_of_the_live_attempt_is_the_live_record(tmp_path: Path) -> None:
    job = Job(
        job_id="32",
        state=JobState.FAILED,
        nodes=["n20"],
        restart_count=0,
        start_time=datetime.now(UTC) - timedelta(minutes=1),
    )
    audit, deps = await gather(tmp_path, job, attempt=0)
    summary = await EvidenceActivities(deps).gather_evidence(
        GatherInput(incident_id="relaunch-dev-32-0", cluster="dev", job_id="32", attempt=0)
    )
    assert summary.job.nodes == ["n20"] and summary.job.restart_count == 0
    assert (Path(summary.bundle_path) / "nodes" / "n20.log").is_file()


async def test_a_node_slurm_dropped_from_the_ending_job_stays_in_its_evidence(
    tmp_path: Path,
) -> None:
    """A node decision set n3 DOWN (its slurmd silent): Slurm ends the job and drops n3 from its
    record (COMPLETING on n20 alone) before it is requeued. The attempt's node-log detection
    (trusted) named n3, and the workflow passes it on (test_workflow_approval.py checks that it
    passes no node that only the job's output names): n3's kernel log is still its evidence.
    A node named only by the job's own output (n7, in the audit trail too) is not read."""
    job = Job(
        job_id="33",
        state=JobState.COMPLETING,
        nodes=["n20"],
        restart_count=0,
        start_time=datetime.now(UTC) - timedelta(minutes=1),
    )
    audit, deps = await gather(tmp_path, job, attempt=0)
    incident = "relaunch-dev-33-0"
    for source, node in (("node_log", "n3"), ("job_log", "n7")):
        await audit.record(
            AuditRecord(
                incident_id=incident,
                kind="detection",
                at=datetime.now(UTC),
                summary=f"{source}: something on {node}",
                nodes=[node],
                data={"source": source},
            )
        )
    (tmp_path / "kern" / "n7.log").write_text(f"{datetime.now(UTC).isoformat()} n7 kernel: {XID}\n")
    summary = await EvidenceActivities(deps).gather_evidence(
        GatherInput(incident_id=incident, cluster="dev", job_id="33", attempt=0, named_nodes=["n3"])
    )
    assert summary.job.nodes == ["n20", "n3"]
    nodes = Path(summary.bundle_path) / "nodes"
    assert XID in (nodes / "n3.log").read_text()
    assert not (nodes / "n7.log").exists()
