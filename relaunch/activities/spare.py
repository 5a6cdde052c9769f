"""The restart step's spare-node restart (``restart_method: spare``, chosen per job by its plan):
the culprits leave the running job, and the job's steps end so that its script starts them again
on the rest of its allocation, a spare among it; the job never leaves RUNNING (docs/spares.md).

Where that cannot be (the scheduler cannot resize a job, the job no longer runs, Slurm keeps a
culprit in it because the job's batch script runs there), the job restarts whole instead, as
without spares, and the restart's detail says why."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from relaunch.activities.deps import Deps, beat
from relaunch.connectors.slurm.spares import ShrinkRefusedError, SpareActions
from relaunch.models.errors import InvalidStateError
from relaunch.models.recovery import ActInput
from relaunch.models.scheduler import ActionResult, Job, JobState

AuditAction = Callable[[str, str, ActionResult], Awaitable[None]]
# The audit row that records, before the job shrinks, which of its steps this restart ends: a
# retry ends those and never one the job's script started since.
STEPS_ROW = "spare_steps"


class SpareRestart:
    """One restart step's spare-node restart, with the activity's dependencies and its way of
    writing an action's audit row."""

    def __init__(self, deps: Deps, audit_action: AuditAction) -> None:
        self.deps = deps
        self._audit_action = audit_action

    def actions(self) -> SpareActions | None:
        make = getattr(self.deps.scheduler, "spares", None)
        return make() if callable(make) else None

    async def run(self, inp: ActInput, job: Job) -> tuple[str | None, str]:
        """Take the plan's culprits out of ``job`` and end its steps. Returns (None, detail)
        when the job trains again on what is left, else (why, "") where it must restart whole
        instead (nothing was changed then)."""
        spares = self.actions()
        leaving = sorted(set(inp.plan.exclude_nodes) & set(job.nodes))
        if spares is None:
            return "this cluster's scheduler connection cannot take a node out of a job", ""
        if job.state is not JobState.RUNNING:
            return f"job {job.job_id} is {job.state.value}, not running", ""
        steps = await self._steps(inp, spares, job)
        if leaving:
            beat(f"taking {','.join(leaving)} out of job {job.job_id}")
            try:
                shrunk = await spares.leave(job.job_id, leaving)
            except (ShrinkRefusedError, InvalidStateError) as exc:
                return str(exc), ""
            await self._audit_action(inp.incident_id, "restart", shrunk)
        beat(f"ending the steps {','.join(steps) or '-'} of job {job.job_id}")
        ended = await spares.end_steps(job.job_id, steps)
        await self._audit_action(inp.incident_id, "restart", ended)
        rest = sorted(set(job.nodes) - set(leaving))
        return None, (
            f"{','.join(leaving) or 'nothing'} out of job {job.job_id}; "
            f"step(s) {','.join(steps) or '-'} ended: the job trains again on "
            f"{','.join(rest)} ({job.train_nodes} train, "
            f"{len(rest) - (job.train_nodes or 0)} spare left)"
        )

    async def _steps(self, inp: ActInput, spares: SpareActions, job: Job) -> list[str]:
        """The steps this restart ends: those an earlier attempt recorded, else the job's
        running steps now, recorded before anything changes."""
        for e in await self.deps.audit.events(inp.incident_id):
            recorded = e.data.get("steps")
            if e.kind == STEPS_ROW and e.data.get("job_id") == job.job_id:
                return [str(s) for s in recorded] if isinstance(recorded, list) else []
        steps = await spares.steps(job.job_id)
        await self.deps.audit_row(
            inp.incident_id,
            STEPS_ROW,
            f"job {job.job_id} runs step(s) {','.join(steps) or '-'}: ended once "
            f"{','.join(inp.plan.exclude_nodes)} leave(s) it",
            dedupe=f"{STEPS_ROW}:{job.job_id}",
            data={"job_id": job.job_id, "steps": steps},
        )
        return steps
