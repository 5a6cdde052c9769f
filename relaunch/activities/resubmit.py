"""The restart step's resubmission (``restart_method: resubmit``): cancel the job and submit its
script again as its own user, once across retries, with lineage that only Relaunch's own audit
trail records (docs/trust.md, "Resubmission lineage"; relaunch/models/lineage.py)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from relaunch.activities.deps import Deps, beat
from relaunch.models.errors import JobNotFoundError, ResubmitIdentityError, VerificationError
from relaunch.models.lineage import new_nonce, nonce_digest, same_user, submitted_earlier
from relaunch.models.recovery import ActInput
from relaunch.models.scheduler import ActionResult, Job

AuditAction = Callable[[str, str, ActionResult], Awaitable[None]]


def _brief(job: Job) -> str:
    return f"{job.state.value} nodes={','.join(job.nodes) or '-'} user={job.user or '-'}"


class Resubmission:
    """One restart step's resubmission, with the activity's dependencies and its way of writing
    an action's audit row."""

    def __init__(self, deps: Deps, audit_action: AuditAction) -> None:
        self.deps = deps
        self._audit_action = audit_action

    async def run(self, inp: ActInput, job: Job) -> ActionResult:
        """Cancel the job (if it still runs) and submit its script again, once across retries.

        Which job is the resubmission comes from this recovery's audit trail alone
        (relaunch/models/lineage.py): the child recorded by an earlier attempt, else one an
        attempt submitted with a nonce it recorded before ``sbatch`` and died before recording
        (found by that nonce and the parent's uid), else a new submission, its intent recorded
        before ``sbatch`` and its id right after. A job whose comment merely names the parent
        is never taken for its child."""
        sched, incident = self.deps.scheduler, inp.incident_id
        events = await self.deps.audit.events(incident)
        recorded = next(
            (
                str(e.data["child"])
                for e in events
                if e.kind == "lineage" and e.data.get("parent") == job.job_id
            ),
            None,
        )
        if recorded is not None:
            beat(f"resubmitted as {recorded} (recorded)")
            child = await self._child_of(job, recorded)
            # Not yet counted when the attempt that recorded the child died before its
            # restart row: this row counts it (the restart budget reads these rows).
            counted = any(e.kind == "action" and e.data.get("step") == "restart" for e in events)
            return ActionResult(
                action="resubmit",
                target=job.job_id,
                changed=not counted,
                note=f"already resubmitted as {recorded}",
                after=_brief(child) if child else "no longer listed",
                new_job_id=recorded,
            )
        if job.state.is_active:
            await self._audit_action(incident, "cancel", await sched.cancel_job(job.job_id))
        digests = {
            str(e.data["nonce_digest"])
            for e in events
            if e.kind == "resubmit_intent" and e.data.get("parent") == job.job_id
        }
        found = submitted_earlier(job, await sched.list_jobs(), digests) if digests else None
        if found is not None:
            # Submitted by an attempt that died before recording it: recorded now, and counted
            # as this step's restart (changed), as the earlier attempt would have.
            await self._record_child(inp, job, found.job_id, "found after an interrupted attempt")
            return ActionResult(
                action="resubmit",
                target=job.job_id,
                changed=True,
                note=f"resubmitted as {found.job_id} by an earlier attempt of this step",
                after=_brief(found),
                new_job_id=found.job_id,
            )
        nonce = new_nonce()
        await self.deps.audit_row(
            incident,
            "resubmit_intent",
            f"resubmitting {job.job_id} as its user (uid {job.user_id})",
            dedupe=f"resubmit_intent:{nonce_digest(nonce)}",
            data={
                "parent": job.job_id,
                "user": job.user,
                "user_id": job.user_id,
                "nonce_digest": nonce_digest(nonce),
            },
        )
        beat(f"resubmitting {job.job_id}")
        result = await sched.resubmit_job(job.job_id, exclude=inp.plan.exclude_nodes, nonce=nonce)
        if not result.new_job_id:
            raise VerificationError(f"resubmission of {job.job_id}: sbatch gave no job id")
        await self._record_child(inp, job, result.new_job_id, "submitted")
        await self._child_of(job, result.new_job_id)
        return result

    async def _record_child(self, inp: ActInput, parent: Job, child: str, how: str) -> None:
        """The ``lineage`` row every reader of lineage trusts (AuditStore.resubmitted_from)."""
        await self.deps.audit_row(
            inp.incident_id,
            "lineage",
            f"job {child} is the resubmission of {parent.job_id} ({how})",
            dedupe=f"lineage:{parent.job_id}",
            data={
                "parent": parent.job_id,
                "child": child,
                "user": parent.user,
                "user_id": parent.user_id,
                "how": how,
            },
        )

    async def _child_of(self, parent: Job, child_id: str) -> Job | None:
        """A fresh read of the child: it must run as the parent's user (None once it has left
        Slurm's listing)."""
        try:
            child = await self.deps.scheduler.get_job(child_id)
        except JobNotFoundError:
            return None
        if not same_user(parent, child):
            raise VerificationError(
                f"job {child_id}, recorded as the resubmission of {parent.job_id}, runs as "
                f"{child.user or '?'} (uid {child.user_id}), not as the job's user "
                f"{parent.user or '?'} (uid {parent.user_id})"
            )
        return child

    async def check_identity(self, incident_id: str, job: Job) -> None:
        """Refuse, before anything is cancelled, a resubmission that would not run as the
        job's own user; the refusal and its reason go into the audit trail."""
        try:
            self.deps.scheduler.resubmit_identity(job)
        except ResubmitIdentityError as exc:
            await self.deps.audit_row(
                incident_id,
                "action",
                f"resubmit {job.job_id}: REFUSED — {exc.message}",
                dedupe=f"action:restart:refused:{job.job_id}",
                data={"step": "restart", "action": "resubmit", "refused": exc.message},
            )
            raise
