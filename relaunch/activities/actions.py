"""Activities that change the cluster: isolate (drain, fence), restart, hold; and the looks at a
restarted job (verify_check).

Each re-reads the scheduler before acting (the adapter's actions are idempotent), so that an
approval that arrives late, or a retry after a worker crash, never repeats what is done."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Collection, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import BaseModel, Field
from temporalio import activity
from temporalio.service import RPCError

from relaunch.activities.deps import Deps, beat, keeps_heartbeating, log, typed_errors
from relaunch.activities.resubmit import Resubmission
from relaunch.activities.spare import SpareRestart
from relaunch.connectors.joboutput import FileAccess, tail_file
from relaunch.connectors.launcher_health import LauncherHealth
from relaunch.detection.launchers import launcher_of
from relaunch.detection.planning import blast_radius, held_out, partition_size
from relaunch.detection.progress import ResumeProgress, resumed_progress
from relaunch.models.errors import (
    InvalidStateError,
    JobNotFoundError,
    RelaunchError,
    VerificationError,
)
from relaunch.models.lifecycle import LifecycleFault
from relaunch.models.recovery import (
    ActInput,
    Category,
    GuardDecision,
    LauncherLook,
    LauncherLookInput,
    Policy,
    RestartMethod,
    StepOutcome,
    VerifyCheck,
    VerifyInput,
    drain_reason,
    drained_by,
)
from relaunch.models.scheduler import ActionResult, Job, JobState, Node

if TYPE_CHECKING:  # imported where used: the workflow modules import the activities
    from relaunch.workflows.node_client import LifecycleSignals

# What one look at a job's output since its evidence reads at most (its last part).
LAUNCHER_LOOK_BYTES = 256 * 1024


class DrainCheck(BaseModel):
    """The blast-radius guard as `isolate` re-checks it right before draining."""

    decision: GuardDecision
    out_of_service: list[str] = Field(description="nodes Relaunch took out that are still out")
    new: list[str] = Field(description="nodes this drain would take out of service")


def drain_check(
    policy: Policy,
    nodes: Sequence[Node],
    drained_by_relaunch: Collection[str],
    to_drain: Sequence[str],
    *,
    partition: str,
    since: datetime,
) -> DrainCheck:
    """The guard over a fresh read of the nodes: the nodes Relaunch drained in the window (its
    audit trail, or Slurm's own drain reason where a crash lost the audit row) that are still
    drained or down, and the nodes of ``to_drain`` not drained yet. A node already out of
    service is not new, so a drained node that fails again is counted once."""
    out = held_out(nodes, drained_by_relaunch, since)
    flagged = {n.name for n in nodes if n.drain_flag}
    new = [n for n in dict.fromkeys(to_drain) if n not in flagged and n not in out]
    size = partition_size(nodes, partition)
    return DrainCheck(
        decision=blast_radius(policy, size, out, new), out_of_service=sorted(out), new=new
    )


class ActionActivities:
    def __init__(self, deps: Deps) -> None:
        self.deps = deps
        self._lifecycles: LifecycleSignals | None = None

    async def _audit_action(self, incident_id: str, step: str, result: ActionResult) -> None:
        verb = "done" if result.changed else f"unchanged ({result.note})"
        await self.deps.audit_row(
            incident_id,
            "action",
            f"{result.action} {result.target}: {verb}",
            dedupe=f"action:{step}:{result.action}:{result.target}",
            nodes=[result.target] if step in {"drain", "fence"} else [],
            data={"step": step, **result.model_dump(mode="json")},
        )

    @activity.defn(name="isolate")
    @typed_errors
    @keeps_heartbeating
    async def isolate(self, inp: ActInput) -> StepOutcome:
        """Drain (and fence) the plan's nodes under the cluster's drain lock, after re-checking
        the blast-radius guard on fresh state: recoveries planned or approved at the same time
        see each other's drains. A refusal drains nothing and answers ``ok=False``."""
        if not inp.plan.drain_nodes and not inp.plan.fence_nodes:
            return StepOutcome(ok=True, detail="nothing to isolate")
        await self.deps.unless_paused(inp.incident_id, "isolate")
        beat("waiting for the cluster's drain lock")
        async with self.deps.audit.drain_lock(inp.cluster):
            refused = await self._recheck_guard(inp)
            if refused is not None:
                return refused
            outcome = await self._drain_and_fence(inp)
        await self._start_lifecycles(inp, [*inp.plan.drain_nodes, *inp.plan.fence_nodes])
        return outcome

    @activity.defn(name="check_suspects")
    @typed_errors
    async def check_suspects(self, inp: ActInput) -> StepOutcome:
        """Send the plan's check nodes (suspects the jobs of several users named) to their
        lifecycles: checked in a maintenance reservation, never drained on the suspicion; only
        failing checks, Relaunch's own evidence, take one out of service."""
        await self.deps.unless_paused(inp.incident_id, "check_suspects")  # a fence follows
        nodes = inp.plan.check_nodes
        if not self.deps.config.lifecycle.enabled or self.deps.temporal is None:
            return StepOutcome(ok=True, detail="node lifecycles are off: no checks")
        await self._start_lifecycles(inp, nodes, suspect=True)
        return StepOutcome(ok=True, detail=f"{', '.join(nodes)} sent to their lifecycle's checks")

    async def _start_lifecycles(
        self, inp: ActInput, nodes: list[str], *, suspect: bool = False
    ) -> None:
        """Hand each node this plan took out (or, ``suspect``, named by several users' jobs)
        to its lifecycle (relaunch/workflows/lifecycle.py: checks, remediation, return or
        repair). A lifecycle that cannot be started is said in the incident's trail; a drain
        stands, and the node waits for a person."""
        settings, client = self.deps.config.lifecycle, self.deps.temporal
        if not settings.enabled or client is None:
            return
        if self._lifecycles is None or self._lifecycles.client is not client:
            from relaunch.workflows.node_client import LifecycleSignals

            self._lifecycles = LifecycleSignals(client)
        plan = inp.plan
        category = plan.category or Category.NODE_FAILURE
        for node in dict.fromkeys(nodes):
            remedy = None if suspect else plan.remedies.get(node)
            fault = LifecycleFault(
                incident_id=inp.incident_id,
                category=category,
                remedy=remedy,
                kind=f"suspect/{category.value}"
                if suspect
                else f"{category.value}/{remedy or 'none'}",
                summary=(plan.reasons[0] if plan.reasons else "")[:300],
                at=datetime.now(UTC),
                suspect=suspect,
            )
            try:
                lifecycle = await self._lifecycles.fault(self.deps.config, node, fault)
            except (RelaunchError, RPCError) as exc:
                log.warning("no lifecycle for %s: %s", node, exc)
                await self.deps.audit_row(
                    inp.incident_id,
                    "lifecycle",
                    f"could not start {node}'s lifecycle: {exc}"[:500],
                    dedupe=f"lifecycle:{node}:failed",
                    nodes=[node],
                )
                continue
            await self.deps.audit_row(
                inp.incident_id,
                "lifecycle",
                f"{node} handed to its lifecycle {lifecycle}"
                + (" for its checks (a suspect: not drained)" if suspect else ""),
                dedupe=f"lifecycle:{node}",
                nodes=[node],
                data={"lifecycle": lifecycle},
            )

    async def _recheck_guard(self, inp: ActInput) -> StepOutcome | None:
        """The guard re-checked under the lock; a StepOutcome when it refuses the drain."""
        sched, plan, policy = self.deps.scheduler, inp.plan, self.deps.config.policy
        beat("re-checking the blast-radius guard")
        since = datetime.now(UTC) - timedelta(hours=policy.drain_window_hours)
        partition = plan.guard_partition
        if partition is None:
            try:  # the shared brief listing: a rack's decisions drain one after another
                partition = (await sched.get_job_brief(plan.job_id)).partition
            except JobNotFoundError:  # the job has left Slurm: count the whole cluster
                partition = ""
        check = drain_check(
            policy,
            await sched.list_nodes(),
            await self.deps.audit.drained_nodes(inp.cluster, since),
            plan.drain_nodes,
            partition=partition,
            since=since,
        )
        guard = check.decision
        data = {
            **guard.model_dump(mode="json"),
            "at": "drain",
            **check.model_dump(mode="json", exclude={"decision"}),
        }
        if guard.allowed:
            return None
        if plan.needs_override and await self._override_approved(inp.incident_id):
            await self.deps.audit_row(
                inp.incident_id,
                "guard",
                f"{guard.guard}: overridden by an operator's approval at drain time — "
                f"{guard.detail}",
                dedupe=f"guard:{guard.guard}:drain",
                nodes=check.new,
                # Allowed by the override: the plan's own row already counts the refusal.
                data={**data, "allowed": True, "overridden": True},
            )
            return None
        detail = (
            f"{guard.guard}: REFUSED at drain time — {guard.detail}; "
            f"{','.join(check.new)} not drained"
        )
        await self.deps.audit_row(
            inp.incident_id,
            "guard",
            detail,
            dedupe=f"guard:{guard.guard}:drain",
            nodes=check.new,
            data=data,
        )
        return StepOutcome(ok=False, detail=detail)

    async def _override_approved(self, incident_id: str) -> bool:
        """Whether an operator approved this recovery knowing a guard refused it. Read from the
        audit trail rather than trusted from the plan: a workflow that predates overrides
        sends a refused plan to isolate without asking anyone."""
        events = await self.deps.audit.events(incident_id)
        return any(e.kind == "approval" and e.data.get("override") is True for e in events)

    async def _flag_for_launchers(self, inp: ActInput, node: str) -> None:
        """Take the node's health file away before it is drained, so that a job's launcher
        leaves it out of its next rendezvous (relaunch/connectors/launcher_health.py). A file
        that cannot be written never stops the drain: it is said in the trail."""
        pattern = self.deps.config.launcher_health_pattern
        if not pattern:
            return
        health = LauncherHealth(pattern)
        category = inp.plan.category.value if inp.plan.category else "a fault"
        try:
            flagged = await asyncio.to_thread(
                health.flag, node, incident=inp.incident_id, reason=f"convicted of {category}"
            )
        except (OSError, ValueError) as exc:
            summary, data = f"{node}: its launcher health file not removed: {exc}", {}
        else:
            summary = f"{node}: launcher health file {health.path(node)} " + (
                "removed: the jobs' launchers leave it out" if flagged else "already gone"
            )
            data = {"path": str(health.path(node)), "removed": flagged}
        await self.deps.audit_row(
            inp.incident_id,
            "launcher_health",
            summary,
            dedupe=f"launcher_health:{node}",
            nodes=[node],
            data=data,
        )

    async def _drain_and_fence(self, inp: ActInput) -> StepOutcome:
        sched, plan = self.deps.scheduler, inp.plan
        reason = drain_reason(inp.incident_id)
        notes = []
        changed = False
        for node in sorted({*plan.drain_nodes, *plan.fence_nodes}):
            await self._flag_for_launchers(inp, node)
        for node in plan.drain_nodes:
            beat(f"drain {node}")
            result = await sched.drain_node(node, reason)
            _, _, earlier = result.note.partition("already draining/drained: ")
            if not result.changed and drained_by(earlier, inp.incident_id):
                # Drained by this incident in an attempt that died before recording it (a
                # worker killed mid-activity): the audit, and the blast-radius guard that reads
                # it, must still count this drain as this incident's.
                result = result.model_copy(
                    update={"changed": True, "note": "drained by an earlier attempt of this step"}
                )
            await self._audit_action(inp.incident_id, "drain", result)
            changed |= result.changed
            notes.append(f"{node}: {'drained' if result.changed else result.note}")
        for node in plan.fence_nodes:
            beat(f"fence {node}")
            result = await sched.fence_node(node, reason + " (slurmd unreachable)")
            await self._audit_action(inp.incident_id, "fence", result)
            changed |= result.changed
            notes.append(f"{node}: {'marked down' if result.changed else result.note}")
        return StepOutcome(ok=True, changed=changed, detail="; ".join(notes))

    @activity.defn(name="restart")
    @typed_errors
    @keeps_heartbeating
    async def restart(self, inp: ActInput) -> StepOutcome:
        """Restart the job (requeue, cancel and resubmit, or train again on a spare of its
        own allocation), without its culprits."""
        await self.deps.unless_paused(inp.incident_id, "restart")
        sched, plan = self.deps.scheduler, inp.plan
        beat("restart")
        job = await sched.get_job(plan.job_id)
        if job.state is JobState.CANCELLED and not await self._cancelled_here(inp.incident_id):
            # Someone cancelled the job after this recovery began (a scancel is seen in the
            # log before Slurm lists the job CANCELLED): a restart would undo their decision.
            raise InvalidStateError(
                f"job {job.job_id} was cancelled after this recovery began; it is not restarted"
            )
        if plan.restart_method is RestartMethod.RESUBMIT:
            resubmission = Resubmission(self.deps, self._audit_action)
            await resubmission.check_identity(inp.incident_id, job)
            result = await resubmission.run(inp, job)
            await self._audit_action(inp.incident_id, "restart", result)
            return StepOutcome(
                ok=True,
                changed=result.changed,
                detail=result.note or result.after,
                new_job_id=result.new_job_id,
            )
        instead = ""
        if plan.restart_method is RestartMethod.SPARE:
            why, detail = await SpareRestart(self.deps, self._audit_action).run(inp, job)
            if why is None:
                return StepOutcome(ok=True, changed=True, detail=detail)
            instead = f"no spare-node restart ({why}): "
        result = await sched.requeue_job(
            job.job_id, expected_restart_count=plan.expected_restart_count
        )
        await self._audit_action(inp.incident_id, "restart", result)
        detail = instead + (result.note or "requeued")
        if plan.exclude_nodes:
            detail += "; " + await self._exclude_when_pending(inp, job.job_id)
        return StepOutcome(ok=True, changed=result.changed, detail=detail)

    async def _cancelled_here(self, incident_id: str) -> bool:
        """Whether this recovery cancelled the job itself (to resubmit it)."""
        events = await self.deps.audit.events(incident_id)
        return any(e.kind == "action" and e.data.get("step") == "cancel" for e in events)

    async def _exclude_when_pending(self, inp: ActInput, job_id: str) -> str:
        """Exclude the culprits from the requeued job. The adapter waits out the moment the
        job is still COMPLETING; if it is already running again, the drained nodes were
        off-limits to the scheduler anyway."""
        sched, nodes = self.deps.scheduler, inp.plan.exclude_nodes
        deadline = time.monotonic() + 60
        while True:
            beat("excluding the culprits from the requeued job")
            try:
                result = await sched.exclude_nodes(job_id, nodes)
            except VerificationError:  # still completing: a node is slow to let go
                if time.monotonic() > deadline:
                    return "not excluded (still completing); drained nodes take no new work"
                continue
            except InvalidStateError:
                job = await sched.get_job(job_id)
                if job.state is JobState.RUNNING:
                    return f"already running again on {','.join(job.nodes)}"
                return f"not excluded ({job.state.value}); drained nodes take no new work"
            await self._audit_action(inp.incident_id, "exclude", result)
            return f"excluded {','.join(nodes)}"

    @activity.defn(name="hold")
    @typed_errors
    @keeps_heartbeating
    async def hold(self, inp: ActInput) -> StepOutcome:
        """Hold the job while it is pending (left for a human otherwise)."""
        await self.deps.unless_paused(inp.incident_id, "hold")
        job = await self.deps.scheduler.get_job(inp.plan.job_id)
        if job.state is not JobState.PENDING:
            return StepOutcome(
                ok=True,
                detail=f"job {job.job_id} is {job.state.value}: nothing to hold, left for a human",
            )
        result = await self.deps.scheduler.hold_job(job.job_id)
        await self._audit_action(inp.incident_id, "hold", result)
        return StepOutcome(ok=True, changed=result.changed, detail=result.note or "held")

    async def _resumed(self, job: Job, access: FileAccess) -> ResumeProgress | None:
        """The last resume in the end of the job's log and the latest step past it."""
        pattern = self.deps.config.watch.progress_pattern
        return await asyncio.to_thread(_resumed_progress, Path(job.stdout_path), access, pattern)

    async def _verified(self, inp: VerifyInput, job: Job, detail: str) -> None:
        """The verification's audit row (once per recovery)."""
        await self.deps.audit_row(
            inp.incident_id,
            "verify",
            detail,
            dedupe="verify",
            nodes=job.nodes,
            data={"job_id": job.job_id, "nodes": job.nodes},
        )

    @activity.defn(name="launcher_look")
    @typed_errors
    async def launcher_look(self, inp: LauncherLookInput) -> LauncherLook:
        """One look at a running job whose own launcher may restart it in the job: the same
        attempt still RUNNING (Slurm's word) with a resume and a step past it in its output
        since the evidence (the job's word: it only ever holds this job's own recovery back),
        or the job ended or requeued, or neither yet."""
        job = await self.deps.scheduler.get_job_brief(inp.job_id)
        if job.state is not JobState.RUNNING or job.restart_count != inp.restart_count:
            return LauncherLook(
                ended=True,
                detail=f"job {job.job_id} is {job.state.value} (attempt {job.restart_count})",
            )
        text = ""
        if job.stdout_path:
            access = await asyncio.to_thread(FileAccess.for_job, job, self.deps.config.job_output)
            read = await asyncio.to_thread(
                tail_file, job.stdout_path, access, LAUNCHER_LOOK_BYTES, inp.since_offset
            )
            text = read.text
        launcher = launcher_of(text) or inp.launcher
        found = resumed_progress(text, self.deps.config.watch.progress_pattern)
        if found is None:
            return LauncherLook(launcher=launcher, detail=f"job {job.job_id} not training yet")
        return LauncherLook(
            trained_again=True,
            launcher=launcher,
            resumed_step=found.step,
            latest_step=found.latest,
            detail=f"resumed from checkpoint step {found.step}, now at step {found.latest} "
            f"on {','.join(job.nodes)}, in the same attempt",
        )

    @activity.defn(name="verify_check")
    @typed_errors
    async def verify_check(self, inp: VerifyInput) -> VerifyCheck:
        """One look at a restarted job: RUNNING on healthy nodes and, where it prints
        progress, past its checkpoint. The workflow waits on a durable timer between looks,
        so no activity slot is held while the job comes back."""
        job = await self.deps.scheduler.get_job_brief(inp.job_id)
        bad = set(job.nodes) & set(inp.avoid_nodes)
        if bad and job.state is JobState.RUNNING:
            bad -= await self._validated_since(inp, bad)
        if job.state.is_terminal:
            return VerifyCheck(failed=True, detail=f"job {job.job_id} ended ({job.state.value})")
        if job.state is not JobState.RUNNING or bad:
            seen = f"{job.state.value} on {','.join(job.nodes) or '-'} {job.reason}"
            return VerifyCheck(detail=seen.strip())
        detail = f"RUNNING on {','.join(job.nodes)}"
        if inp.checkpoint_step is not None and job.stdout_path:
            access = await asyncio.to_thread(FileAccess.for_job, job, self.deps.config.job_output)
            found = await self._resumed(job, access)
            if found is None or found.step < inp.checkpoint_step:
                return VerifyCheck(detail=f"{detail}; waiting for progress past the checkpoint")
            detail += f"; {_resume_text(found, inp.checkpoint_step)}"
        await self._verified(inp, job, detail)
        return VerifyCheck(done=True, detail=detail)

    async def _validated_since(self, inp: VerifyInput, nodes: set[str]) -> set[str]:
        """The avoided ``nodes`` that a node lifecycle has validated and returned to service
        since this recovery began: Relaunch's own checks passed there, so a job that runs on
        one runs on a healthy node (the requeue of a node decision does not exclude its node:
        the drain and the lifecycle's reservation keep jobs off it until then)."""
        stages = await self.deps.audit.node_stages(inp.cluster)
        returned = {n: row.at for n in nodes if (row := stages.get(n)) and row.stage == "returned"}
        if not returned:
            return set()
        events = await self.deps.audit.events(inp.incident_id)
        began = events[0].at if events else None
        return {n for n, at in returned.items() if began is not None and at > began}


def _resume_text(found: ResumeProgress, checkpoint: int) -> str:
    return (
        f"resumed from checkpoint step {found.step} "
        f"(last saved before the fault: {checkpoint}), now at step {found.latest} "
        f"({found.framework})"
    )


def _resumed_progress(
    log: Path, access: FileAccess, pattern: str | None = None, window: int = 256 * 1024
) -> ResumeProgress | None:
    """The last resume in the end of the log and the latest step past it, or None."""
    return resumed_progress(tail_file(str(log), access, window).text, pattern)
