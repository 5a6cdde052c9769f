"""Activities that observe and decide: record detections, gather evidence, attribute, plan.

Decisions are made here, not in the workflow, so that they are recorded in history and rule
changes need no workflow versioning."""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

from temporalio import activity

from relaunch.activities.approval_identity import decision_sender
from relaunch.activities.deps import Deps, typed_errors
from relaunch.activities.health_evidence import health_evidence
from relaunch.connectors.audit import StoredEvent
from relaunch.connectors.bundles import read_bundle, write_bundle
from relaunch.connectors.joboutput import FileEvidence, read_file_evidence
from relaunch.connectors.liveness import ProbeError, Prober, ProbeTarget
from relaunch.connectors.logstores import fetch_evidence_logs
from relaunch.connectors.telemetry import read_job_telemetry
from relaunch.detection.attribution import attribute_bundle, implicated, suspects
from relaunch.detection.launchers import launcher_of
from relaunch.detection.lines import lines_since
from relaunch.detection.liveness import alive_despite_probe
from relaunch.detection.markers import last_progress
from relaunch.detection.planning import PlanHistory, held_out, make_plan, partition_size
from relaunch.detection.progress import last_checkpoint
from relaunch.models.bundle import BundleJob
from relaunch.models.config import ClusterConfig
from relaunch.models.recovery import (
    ActionPlan,
    AttributeInput,
    Category,
    EvidenceSummary,
    GatherInput,
    JobSnapshot,
    PlanInput,
    RecordDetectionInput,
    RecordEventInput,
    Verdict,
)
from relaunch.models.scheduler import Job, Node

LOG_TAIL_BYTES = 4 * 1024 * 1024
NODE_LOG_TAIL_BYTES = 1024 * 1024
# The end of the job's output searched for its launcher's lines (torchrun, ft_launcher).
LAUNCHER_TAIL = 256 * 1024
# The evidence step's own probe of the job's nodes (see probe_now).
# The evidence of an attempt the job has moved on from (requeued since) reads its nodes' kernel
# logs from this long before its first detection.
MOVED_ON_LOOKBACK = timedelta(minutes=10)
PROBE_TRIES = 2
PROBE_PAUSE_S = 0.5
PROBE_TIMEOUT_S = 1.0
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


async def _file_evidence(job: Job, start: int, config: ClusterConfig) -> FileEvidence:
    """The job's output files read as its user may (from byte ``start``; refused files
    recorded, never read) and this attempt's lines of each node's kernel log."""
    files = await read_file_evidence(
        job,
        start=start,
        node_log_pattern=config.node_log_pattern,
        settings=config.job_output,
        log_limit=LOG_TAIL_BYTES,
        node_log_limit=NODE_LOG_TAIL_BYTES,
    )
    kept = {node: lines_since(text, job.start_time) for node, text in files.node_logs.items()}
    return files.model_copy(update={"node_logs": {n: t for n, t in kept.items() if t}})


def _last_progress(events: list[StoredEvent]) -> datetime | None:
    """When training last advanced, as the watcher's hang detections state it."""
    stamps = [
        datetime.fromisoformat(str(e.data["fault_time"]))
        for e in events
        if e.kind == "detection" and e.data.get("source") == "progress" and e.data.get("fault_time")
    ]
    return min(stamps) if stamps else None


# The rows of a person's decision, and the decision whose sender Temporal recorded.
SENDER_KINDS = {"approval": "approve", "rejection": "reject"}


@dataclass(frozen=True)
class ProbeRead:
    """The recovery's fresh probe of some nodes: those it convicts as silent, and those no
    probe reached that are alive all the same, with why (``alive_despite_probe``)."""

    silent: list[str] = field(default_factory=list)
    alive: dict[str, str] = field(default_factory=dict)


async def probe_now(prober: Prober, nodes: list[Node]) -> ProbeRead:
    """The nodes whose slurmd answers none of ``PROBE_TRIES`` probes ``PROBE_PAUSE_S``
    apart: the recovery's own fresh read of what the watcher's probe saw (one lost packet
    convicts nobody). A node Slurm lists without an address and port is not probed. ``nodes``
    is Slurm's fresh read: a node that gave no answer at all (a timeout: a full listen backlog
    looks the same as a dead node) while Slurm sees its slurmd responding is alive, not silent
    (relaunch/detection/liveness.py)."""
    targets = []
    for node in nodes:
        if node.address and node.port:
            with contextlib.suppress(ValueError):  # an address no probe may be sent to
                targets.append(ProbeTarget(node.name, node.address, node.port))
    details: dict[str, str] = {}
    for attempt in range(PROBE_TRIES):
        if not targets:
            break
        if attempt:
            await asyncio.sleep(PROBE_PAUSE_S)
        try:
            results = await prober.probe(targets, PROBE_TIMEOUT_S)
        except ProbeError as exc:  # no probe could be sent: nothing is known, not "dead"
            activity.logger.warning("could not probe the nodes: %s", exc)
            return ProbeRead()
        answered = {r.node for r in results if r.ok}
        details.update({r.node: r.detail for r in results if not r.ok})
        targets = [t for t in targets if t.node not in answered]
    by_name = {n.name: n for n in nodes}
    read = ProbeRead()
    for target in targets:
        why = alive_despite_probe(details.get(target.node, ""), by_name.get(target.node))
        if why is None:
            read.silent.append(target.node)
        else:
            read.alive[target.node] = f"no probe answered (timeout), but {why}"
    return read


async def unreachable_now(prober: Prober, nodes: list[Node]) -> list[str]:
    """The nodes :func:`probe_now` convicts as silent."""
    return (await probe_now(prober, nodes)).silent


class EvidenceActivities:
    def __init__(self, deps: Deps) -> None:
        self.deps = deps

    @activity.defn(name="record_detection")
    @typed_errors
    async def record_detection(self, inp: RecordDetectionInput) -> bool:
        d = inp.detection
        await self.deps.audit.ensure_incident(inp.incident_id, d.cluster, d.job_id, d.attempt)
        latency = (d.detected_at - d.fault_time).total_seconds() if d.fault_time else None
        return await self.deps.audit_row(
            inp.incident_id,
            "detection",
            f"{d.source.value}: {d.kind}" + (f" — {d.text[:200]}" if d.text else ""),
            dedupe=f"detection:{d.kind}:{','.join(d.nodes)}",
            nodes=d.nodes,
            data={
                "source": d.source.value,
                "kind": d.kind,
                "signature": d.signature,
                "fault_time": d.fault_time.isoformat() if d.fault_time else None,
                "detected_at": d.detected_at.isoformat(),
                "detection_latency_s": latency,
                "text": d.text[:500],
            },
        )

    @activity.defn(name="record_event")
    @typed_errors
    async def record_event(self, inp: RecordEventInput) -> bool:
        # A node decision's incident has no job: its job_id is "".
        if inp.cluster and inp.job_id is not None and inp.attempt is not None:
            await self.deps.audit.ensure_incident(
                inp.incident_id, inp.cluster, inp.job_id, inp.attempt
            )
        data = inp.data
        info = activity.info()
        if inp.kind in SENDER_KINDS and self.deps.temporal is not None and info.workflow_id:
            # The name in an approval is the sender's say-so: keep who Temporal says sent it.
            sender = await decision_sender(
                self.deps.temporal, info.workflow_id, info.workflow_run_id, SENDER_KINDS[inp.kind]
            )
            if sender:
                data = {**data, "temporal_identity": sender["identity"], "via": sender["via"]}
        return await self.deps.audit_row(
            inp.incident_id,
            inp.kind,
            inp.summary,
            dedupe=inp.dedupe,
            nodes=inp.nodes,
            stage=inp.stage,
            actor=inp.actor,
            data=data,
        )

    @typed_errors
    async def gather_evidence(self, inp: GatherInput) -> EvidenceSummary:
        sched = self.deps.scheduler
        # The brief listing (squeue's text, shared by concurrent readers) has every field the
        # evidence uses; the JSON listing costs 4x as much to read and parse.
        job, nodes, events = await asyncio.gather(
            sched.get_job_brief(inp.job_id),
            sched.list_nodes(),
            self.deps.audit.events(inp.incident_id),
        )
        live = job.restart_count
        if live > inp.attempt:
            # Requeued since this attempt failed (by a node decision, ahead of this recovery,
            # or by Slurm): the live record is a later attempt's, on other nodes. The evidence
            # is this attempt's: the nodes its detections named, its restart count.
            # Its node logs are read from MOVED_ON_LOOKBACK before its first detection (the
            # live record's start time is the later attempt's).
            seen = [e for e in events if e.kind == "detection"]
            first = min((e.at for e in seen), default=datetime.now(UTC))
            job = job.model_copy(
                update={
                    "nodes": sorted({n for e in seen for n in e.nodes}),
                    "restart_count": inp.attempt,
                    "start_time": first - MOVED_ON_LOOKBACK,
                }
            )
        else:
            # Slurm drops a node set DOWN (a node decision fencing a silent node) from a job's
            # record as it ends the job: the nodes that what the job's user cannot write named
            # for this attempt (its Xid line, the probes) stay in its evidence all the same.
            # The workflow picks them (RecoveryWorkflow._name_nodes): one place says what is
            # trusted.
            named = set(inp.named_nodes)
            if named - set(job.nodes):
                job = job.model_copy(update={"nodes": sorted(set(job.nodes) | named)})
        by_name = {n.name: n for n in nodes}
        allocated = [by_name[n] for n in job.nodes if n in by_name]
        probed = await probe_now(self.deps.prober(), allocated)
        unreachable = probed.silent
        # With JobFileAppend a requeued job's log holds every attempt; an earlier attempt's
        # lines were that attempt's evidence, not this one's.
        start = await self._attempt_log_start(inp, job.stdout_path)
        refused: dict[str, str] = {}
        log_size = 0
        if self.deps.log_store is not None:  # Loki / VictoriaLogs: this attempt's time range
            job_log, node_logs = await fetch_evidence_logs(self.deps.log_store, inp.cluster, job)
        else:
            files = await _file_evidence(job, start, self.deps.config)
            job_log, node_logs, log_size = files.job_log, files.node_logs, files.log_size
            refused = files.refused_paths
        # Megabytes of log, line by line: not on the event loop.
        pattern = self.deps.config.watch.progress_pattern
        checkpoint = await asyncio.to_thread(last_checkpoint, job_log, pattern)
        progress_step = await asyncio.to_thread(last_progress, job_log, pattern)
        bundle_job = BundleJob(
            cluster=inp.cluster,
            job_id=job.job_id,
            state=job.state.value,
            exit_code=str(job.exit_code),
            reason=job.reason,
            nodes=job.nodes,
            node_states={n.name: n.display_state for n in allocated},
            observed_at=datetime.now(UTC),
            unreachable_nodes=unreachable,
            detections=[e.summary for e in events if e.kind == "detection"],
            last_progress_at=_last_progress(events),
            progress_step=progress_step,
            refused_paths=refused,
            submit_time=job.submit_time,
            user=job.user,
        )
        path = Path(self.deps.config.bundle_dir) / inp.incident_id
        telemetry = await read_job_telemetry(
            job,
            self.deps.config.telemetry_pattern,
            limit=NODE_LOG_TAIL_BYTES,
            timeout_s=self.deps.config.job_output.read_timeout_s,
        )
        # Health events other systems pushed in for the job's nodes (docs/console.md).
        health = await health_evidence(self.deps.audit, inp.cluster, job)
        await asyncio.to_thread(
            write_bundle, path, bundle_job, job_log, node_logs, telemetry, health
        )
        summary = EvidenceSummary(
            incident_id=inp.incident_id,
            bundle_path=str(path),
            job=JobSnapshot(
                job_id=job.job_id,
                name=job.name,
                state=job.state.value,
                partition=job.partition,
                nodes=job.nodes,
                restart_count=job.restart_count,
                stdout_path=job.stdout_path,
                last_checkpoint_step=checkpoint,
                max_restarts=job.max_restarts,
                user=job.user,
                train_nodes=job.train_nodes,
                launcher=launcher_of(job_log[-LAUNCHER_TAIL:]),
                log_size=log_size,
            ),
            node_states=bundle_job.node_states,
            unreachable_nodes=unreachable,
        )
        await self.deps.audit_row(
            inp.incident_id,
            "evidence",
            f"job {job.job_id} {job.state.value} on {','.join(job.nodes) or '-'}; bundle {path}"
            + (f"; refused to read {', '.join(refused)}" if refused else "")
            + "".join(f"; {n}: {why}, not convicted" for n, why in sorted(probed.alive.items()))
            + (f"; requeued since this attempt (restart {live} now)" if live > inp.attempt else ""),
            dedupe="evidence",
            nodes=job.nodes,
            data={
                "bundle_path": str(path),
                "log_path": job.stdout_path,
                "log_start": start,
                "log_size": log_size,
                "refused_paths": refused,
                "job": {
                    **job.model_dump(mode="json"),
                    "last_checkpoint_step": summary.job.last_checkpoint_step,
                },
                "node_states": bundle_job.node_states,
                "unreachable_nodes": unreachable,
                # Probe-unreachable but alive (a full listen backlog?): recorded, not convicted.
                **({"probe_alive": probed.alive} if probed.alive else {}),
                "log_excerpt": job_log.splitlines()[-40:],
                "node_log_excerpts": {n: t.splitlines()[-10:] for n, t in node_logs.items()},
                "health_events": len(health),
            },
        )
        return summary

    @typed_errors
    async def attribute(self, inp: AttributeInput) -> Verdict:
        bundle = await asyncio.to_thread(read_bundle, Path(inp.bundle_path))
        config = self.deps.config
        policy = config.policy
        since = datetime.now(UTC) - timedelta(hours=policy.repeat_offender_window_hours)
        history = await self.deps.audit.node_reputation(config.name, since)
        verdict = await asyncio.to_thread(
            attribute_bundle,
            bundle,
            reputation={r.node: r.incidents for r in history},
            repeat_offender=policy.repeat_offender_incidents,
        )
        await self.deps.audit_row(
            inp.incident_id,
            "verdict",
            f"{verdict.category.value} on {','.join(verdict.culprit_nodes) or 'no node'} "
            f"(confidence {verdict.confidence:.2f}): {verdict.summary}",
            dedupe="verdict",
            nodes=verdict.culprit_nodes,
            data={
                **verdict.model_dump(mode="json"),
                "implicated": implicated(verdict, bundle),
                # Named by the job's output alone: what the jobs of other users may confirm
                # (AuditStore.suspicions).
                "suspects": suspects(verdict),
                "user": bundle.job.user,
            },
        )
        return verdict

    @activity.defn(name="plan")
    @typed_errors
    async def plan(self, inp: PlanInput) -> ActionPlan:
        job = inp.evidence.job
        now = datetime.now(UTC)
        user = job.user
        # This job and the jobs it was resubmitted from, as the audit trail records them.
        lineage = await self.deps.audit.lineage(inp.cluster, job.job_id)
        # The guard's read is made under the cluster's drain lock, as `isolate`'s re-check is:
        # a plan never sees the drain trail half-written by a drain in progress.
        async with self.deps.audit.drain_lock(inp.cluster):
            plan, history = await self._plan_locked(inp, user, lineage, now)
        await self.deps.audit_row(
            inp.incident_id,
            "plan",
            f"{plan.action.value} ({plan.mode.value})"
            + (f", drain {','.join(plan.drain_nodes)}" if plan.drain_nodes else "")
            + f": {'; '.join(plan.reasons)}",
            dedupe="plan",
            nodes=plan.drain_nodes,
            data={
                **plan.model_dump(mode="json"),
                "history": history.model_dump(mode="json"),
                "user": user,
            },
        )
        await self.deps.audit_guards(inp.incident_id, plan.guards)
        return plan

    async def _plan_locked(
        self, inp: PlanInput, user: str, lineage: list[str], now: datetime
    ) -> tuple[ActionPlan, PlanHistory]:
        """The plan and the history it was made from (called under the drain lock)."""
        policy, job = await self.deps.policy(inp.policy), inp.evidence.job
        nodes = await self.deps.scheduler.list_nodes()
        drain_since = now - timedelta(hours=policy.drain_window_hours)
        # Restarts Slurm knows of (this job's requeues, one per resubmission in its lineage) that
        # the audit trail holds no row for at all (a row lost with the database, a requeue by
        # Slurm itself) count as recent ones: the budget errs on the side of holding the job.
        audited = await self.deps.audit.count_restarts(inp.cluster, lineage, _EPOCH)
        unaudited = max(0, job.restart_count + len(lineage) - 1 - audited)
        history = PlanHistory(
            restarts_in_window=unaudited
            + await self.deps.audit.count_restarts(
                inp.cluster, lineage, now - timedelta(hours=policy.budget_window_hours)
            ),
            # Capacity Relaunch has taken and not yet given back, counted as `isolate` counts it.
            drained_in_window=sorted(
                held_out(
                    nodes,
                    await self.deps.audit.drained_nodes(inp.cluster, drain_since),
                    drain_since,
                )
            ),
            partition_size=partition_size(nodes, job.partition),
            previous_unknown=await self._previous_unknown(inp.cluster, inp.incident_id, lineage),
            already_drained=[n.name for n in nodes if n.name in job.nodes and n.drain_flag],
            suspected_by=await self._suspected_by(
                inp, user, now - timedelta(hours=policy.suspect_window_hours)
            ),
        )
        plan = make_plan(
            request_id=f"{inp.incident_id}/plan",
            verdict=inp.verdict,
            evidence=inp.evidence,
            policy=policy,
            history=history,
        )
        return plan, history

    async def _suspected_by(
        self, inp: PlanInput, user: str, since: datetime
    ) -> dict[str, list[str]]:
        """For this verdict's suspects: the users whose jobs named each one by their output
        alone since ``since`` (verdict rows of the audit trail), this job's user included."""
        named = suspects(inp.verdict)
        if not named:
            return {}
        rows = await self.deps.audit.suspicions(inp.cluster, since)
        out = {r.node: sorted(set(r.users)) for r in rows if r.node in named}
        if user:  # the verdict row may be missing; the bundle still says whose job this is
            for node in named:
                out[node] = sorted({*out.get(node, []), user})
        return out

    async def _unreachable(self, nodes: list[Node]) -> list[str]:
        return await unreachable_now(self.deps.prober(), nodes)

    async def _attempt_log_start(self, inp: GatherInput, log_path: str) -> int:
        """Where this attempt's output starts in the job log: after what the evidence of the
        job's earlier attempts already covered (0 when there is no earlier record)."""
        if inp.attempt == 0 or not log_path:
            return 0
        start = 0
        for row in await self.deps.audit.incidents(cluster=inp.cluster, job_id=inp.job_id):
            if row.attempt >= inp.attempt:
                continue
            for event in await self.deps.audit.events(row.id):
                size = event.data.get("log_size")
                if event.kind == "evidence" and event.data.get("log_path") == log_path:
                    start = max(start, size if isinstance(size, int) else 0)
        return start

    async def _previous_unknown(self, cluster: str, incident_id: str, lineage: list[str]) -> bool:
        """Whether an earlier incident of this job's lineage was already of unknown cause."""
        for job_id in lineage:
            for row in await self.deps.audit.incidents(cluster=cluster, job_id=job_id):
                if row.id != incident_id and row.category == Category.UNKNOWN.value:
                    return True
        return False
