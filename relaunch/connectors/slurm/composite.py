"""In-cluster mode: Slurm through slurmrestd where Slurm 22.05's REST API can do the job, and
through the Slurm CLI (local, or over SSH) where it cannot.

What goes where on 22.05 (API v0.0.38), as checked against a real slurmrestd 22.05.8:

- over REST: every read (``GET /jobs``, ``/job/{id}``, ``/nodes``, ``/node/{name}``), and so
  also the fresh read before and the verifying read after every action, whichever path acts;
  ``hold_job`` / ``release_job`` (``POST /job/{id}`` with ``{"hold": true|false}``) and
  ``cancel_job`` (``DELETE /job/{id}``, SIGKILL as scancel sends).
- over the CLI: ``drain_node``, ``fence_node``, ``resume_node`` (v0.0.38 has no node update:
  ``/node/{name}`` is GET only; it arrived in 23.02), ``requeue_job`` and ``requeue_jobs`` (no
  requeue endpoint; ``{"requeue": true}`` only sets the job's may-be-requeued flag),
  ``exclude_nodes`` (slurmrestd answers ``Disabled key: "excluded_nodes"``) and
  ``resubmit_job`` (the batch script cannot be read over v0.0.38, so
  ``scontrol write batch_script`` + ``sbatch`` it stays).

On 24.11 (v0.0.40-v0.0.42, negotiated by ``SlurmRest``) the same split holds, checked against
a real slurmrestd 24.11.5: the reads and ``POST /job/{id}`` / ``DELETE /job/{id}`` work the same
way; node updates exist there but drains stay on the CLI, one path for every release.

This is ``SlurmCli`` with its reads replaced: the CLI's actions call ``self.get_node`` /
``self.get_job`` / ``self.list_jobs`` for their idempotence check and their verification, so
those go over REST too, with no change to the CLI's action code (a batch requeue reads through
``self._jobs`` / ``self._jobs_brief``, one ``GET /jobs`` each here).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from relaunch.connectors.slurm.commands import SlurmCli
from relaunch.connectors.slurm.rest import SlurmRest
from relaunch.connectors.slurm.runner import CommandRunner
from relaunch.models.scheduler import Job, JobState, Node


class SlurmRestScheduler(SlurmCli):
    """Reads and hold/release/cancel over ``rest`` (slurmrestd); the other actions over the
    Slurm CLI (``env`` / ``runner`` as for ``SlurmCli``). Each action reads fresh state first
    (a retried call changes nothing), acts, and verifies with a fresh read over REST."""

    def __init__(
        self,
        rest: SlurmRest,
        *,
        env: Mapping[str, str] | None = None,
        runner: CommandRunner | None = None,
        timeout: float = 30.0,
        verify_timeout: float = 10.0,
        submit_as: str | None = None,
    ) -> None:
        super().__init__(
            env=env,
            runner=runner,
            timeout=timeout,
            verify_timeout=verify_timeout,
            submit_as=submit_as,
        )
        self.rest = rest

    async def aclose(self) -> None:
        await self.rest.aclose()

    # ---------------------------------------------------------------- reads (REST)

    async def list_jobs(self) -> list[Job]:
        return await self.rest.list_jobs()

    async def get_job(self, job_id: str) -> Job:
        return await self.rest.get_job(job_id)

    async def list_jobs_brief(self) -> list[Job]:
        return await self.list_jobs()  # the REST listing is the one there is

    async def list_jobs_active(self) -> list[Job]:
        return [job for job in await self.list_jobs() if job.state is not JobState.PENDING]

    async def get_job_brief(self, job_id: str) -> Job:
        return await self.rest.get_job(job_id)

    async def _jobs(self, job_ids: Iterable[str]) -> dict[str, Job | None]:
        listed = {job.job_id: job for job in await self.rest.list_jobs()}
        return {job_id: listed.get(job_id) for job_id in job_ids}

    async def _jobs_brief(self, job_ids: Iterable[str]) -> dict[str, Job | None]:
        return await self._jobs(job_ids)  # the REST listing is the one there is

    async def list_nodes(self) -> list[Node]:
        return await self.rest.list_nodes()

    async def get_node(self, name: str) -> Node:
        return await self.rest.get_node(name)

    # ---------------------------------------------------------------- job actions (REST)

    async def _send_hold(self, job_id: str, *, held: bool) -> None:
        await self.rest.update_job(job_id, {"hold": held})

    async def _send_cancel(self, job_id: str) -> None:
        await self.rest.signal_job(job_id, "KILL")  # as scancel sends
