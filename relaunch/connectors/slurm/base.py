"""The scheduler interface every backend implements (reads) and the Slurm CLI implements fully."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol, runtime_checkable

from relaunch.connectors.liveness import Prober
from relaunch.models.scheduler import ActionResult, Job, Node


@runtime_checkable
class SchedulerReader(Protocol):
    """Read-only view of a cluster (the slurmrestd backend provides only this)."""

    async def list_jobs(self) -> list[Job]: ...

    async def get_job(self, job_id: str) -> Job: ...

    async def list_nodes(self) -> list[Node]: ...

    async def get_node(self, name: str) -> Node: ...


@runtime_checkable
class Scheduler(SchedulerReader, Protocol):
    """Reads plus idempotent actions: each reads fresh state, acts only if needed, verifies.

    What the recovery's activities and the console call on a scheduler (``Deps.scheduler``):
    ``SlurmCli``, ``SlurmRestScheduler`` and the tests' ``FakeScheduler`` provide it."""

    async def get_job_brief(self, job_id: str) -> Job:
        """One job from the cheap shared listing, for loops that poll a job's state and nodes
        (``excluded_nodes`` may be empty)."""
        ...

    def resubmit_identity(self, job: Job) -> list[str]:
        """The submit options that make a resubmission of ``job`` run as the job's own user;
        ResubmitIdentityError when it cannot (checked before anything is cancelled)."""
        ...

    async def drain_node(self, name: str, reason: str) -> ActionResult: ...

    async def fence_node(self, name: str, reason: str) -> ActionResult: ...

    def prober(self, method: str = "auto") -> Prober: ...

    async def resume_node(self, name: str) -> ActionResult: ...

    async def requeue_job(
        self, job_id: str, *, hold: bool = False, expected_restart_count: int | None = None
    ) -> ActionResult: ...

    async def requeue_jobs(self, expected: Mapping[str, int]) -> dict[str, ActionResult]:
        """Requeue many jobs at once (a failed rack's), each as ``requeue_job`` with
        ``expected_restart_count`` would (``expected`` maps job id to the restart count the
        caller saw, so a retried call requeues nothing twice), from one read of the queue and
        verified together. One result per id, in the order asked; a job that is not requeued
        (not found, not allowed, refused, not seen requeued) gets ``changed=False`` and a note
        saying why instead of an exception."""
        ...

    async def hold_job(self, job_id: str) -> ActionResult: ...

    async def release_job(self, job_id: str) -> ActionResult: ...

    async def exclude_nodes(self, job_id: str, nodes: Sequence[str]) -> ActionResult: ...

    async def cancel_job(self, job_id: str) -> ActionResult: ...

    async def resubmit_job(
        self, job_id: str, *, exclude: Sequence[str] = (), nonce: str | None = None
    ) -> ActionResult:
        """Submit an ended job's script again (``nonce`` in the child's comment); every call
        submits (the caller finds an earlier child from its audit trail, never by comment)."""
        ...
