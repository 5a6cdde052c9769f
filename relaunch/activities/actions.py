"""Activities that change the cluster: isolate (drain, fence), restart, hold, and verify.

Each re-reads the scheduler before acting (the adapter's actions are idempotent), so that an
approval that arrives late, or a retry after a worker crash, never repeats what is done."""

from __future__ import annotations

import asyncio
import re
import time
from pathlib import Path

from temporalio import activity

from relaunch.activities.deps import Deps, beat, keeps_heartbeating, typed_errors
from relaunch.models.errors import InvalidStateError, VerificationError
from relaunch.models.recovery import ActInput, RestartMethod, StepOutcome, VerifyInput
from relaunch.models.scheduler import ActionResult, JobState

_RESUMED = re.compile(r"resumed from checkpoint step=(\d+)")
_STEP = re.compile(r"\bstep=(\d+)\b")


def drain_reason(incident_id: str) -> str:
    return f"relaunch incident {incident_id}"


class ActionActivities:
    def __init__(self, deps: Deps) -> None:
        self.deps = deps

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
        sched, plan = self.deps.scheduler, inp.plan
        reason = drain_reason(inp.incident_id)
        notes = []
        changed = False
        for node in plan.drain_nodes:
            beat(f"drain {node}")
            result = await sched.drain_node(node, reason)
            if not result.changed and result.note.endswith(reason):
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
            if job.state.is_active:
                await self._audit_action(
                    inp.incident_id, "cancel", await sched.cancel_job(job.job_id)
                )
            result = await sched.resubmit_job(job.job_id, exclude=plan.exclude_nodes)
            await self._audit_action(inp.incident_id, "restart", result)
            return StepOutcome(
                ok=True,
                changed=result.changed,
                detail=result.note or result.after,
                new_job_id=result.new_job_id,
            )
        result = await sched.requeue_job(
            job.job_id, expected_restart_count=plan.expected_restart_count
        )
        await self._audit_action(inp.incident_id, "restart", result)
        detail = result.note or "requeued"
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
        job = await self.deps.scheduler.get_job(inp.plan.job_id)
        if job.state is not JobState.PENDING:
            return StepOutcome(
                ok=True,
                detail=f"job {job.job_id} is {job.state.value}: nothing to hold, left for a human",
            )
        result = await self.deps.scheduler.hold_job(job.job_id)
        await self._audit_action(inp.incident_id, "hold", result)
        return StepOutcome(ok=True, changed=result.changed, detail=result.note or "held")

    @activity.defn(name="verify")
    @typed_errors
    @keeps_heartbeating
    async def verify(self, inp: VerifyInput) -> StepOutcome:
        """The job runs on healthy nodes and, where it prints progress, gets past its checkpoint."""
        sched = self.deps.scheduler
        deadline = time.monotonic() + inp.timeout_s
        while True:
            job = await sched.get_job_brief(inp.job_id)  # polled: the cheap shared listing
            bad = set(job.nodes) & set(inp.avoid_nodes)
            beat(f"{job.state.value} on {','.join(job.nodes) or '-'}")
            if job.state is JobState.RUNNING and not bad:
                break
            if job.state.is_terminal:
                raise VerificationError(f"job {job.job_id} ended ({job.state.value}) instead")
            if time.monotonic() > deadline:
                raise VerificationError(
                    f"job {job.job_id} not running on healthy nodes after {inp.timeout_s:.0f}s "
                    f"({job.state.value} {job.reason})"
                )
            await asyncio.sleep(1.0)
        detail = f"RUNNING on {','.join(job.nodes)}"
        if inp.checkpoint_step is not None and job.stdout_path:
            progress = await self._progress_past(
                Path(job.stdout_path), inp.checkpoint_step, deadline
            )
            detail += f"; {progress}"
        await self.deps.audit_row(
            inp.incident_id,
            "verify",
            detail,
            dedupe="verify",
            nodes=job.nodes,
            data={"job_id": job.job_id, "nodes": job.nodes},
        )
        return StepOutcome(ok=True, detail=detail)

    async def _progress_past(self, log: Path, checkpoint: int, deadline: float) -> str:
        """Wait for the restarted attempt's resume line and a step beyond it in the job log."""
        while True:
            found = await asyncio.to_thread(_resumed_progress, log)
            # An earlier attempt's resume line names an older checkpoint than the one saved
            # before this fault; only a resume from at least that step is this restart's.
            if found is not None and found[0] >= checkpoint:
                resumed, step = found
                return (
                    f"resumed from checkpoint step={resumed} "
                    f"(last saved before the fault: {checkpoint}), now at step {step}"
                )
            if time.monotonic() > deadline:
                raise VerificationError("the restarted job shows no training progress")
            beat("waiting for progress past the checkpoint")
            await asyncio.sleep(1.0)


def _resumed_progress(log: Path, window: int = 256 * 1024) -> tuple[int, int] | None:
    """(resumed step, latest step after it) from the end of the log, or None."""
    try:
        with open(log, "rb") as fh:
            size = fh.seek(0, 2)
            fh.seek(max(0, size - window))
            text = fh.read().decode(errors="replace")
    except OSError:
        return None
    at = text.rfind("resumed from checkpoint")
    if at < 0:
        return None
    tail = text[at:]
    resumed = int(_RESUMED.findall(tail)[0])
    steps = [int(s) for s in _STEP.findall(tail) if int(s) > resumed]
    return (resumed, max(steps)) if steps else None
