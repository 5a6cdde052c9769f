"""An in-memory cluster behind the ``Scheduler`` protocol (relaunch/connectors/slurm/base.py).

For activity and workflow tests that need a scheduler but no Slurm: nodes and jobs are plain
models held in dicts, each action behaves like :class:`~relaunch.connectors.slurm.commands.SlurmCli`
(check the current state, act only when needed, answer with an ``ActionResult`` built by the
adapter's own helpers and notes in the same words, and refuse with the same typed errors), and
every call is recorded in ``calls``. The actions that changed
something are listed apart (``drains``, ``requeues``, ...), so a test can say "drained once"
without counting reads.

Change the cluster between calls the way Slurm would (a requeued job starting again, an
operator's drain) with :meth:`set_job` and :meth:`set_node`::

    sched = FakeScheduler(nodes=[Node(name="n1", state=NodeState.IDLE)], jobs=[...])
    await sched.drain_node("n1", "relaunch incident x")
    assert sched.drains == ["n1"]

Besides the protocol (``get_job_brief`` and ``resubmit_identity`` included) it has what the
watcher and the CLI also call on ``SlurmCli``: ``list_jobs_brief`` and ``batch_script``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from relaunch.connectors.liveness import Prober, make_prober
from relaunch.connectors.slurm.commands import (
    LINEAGE_KEY,
    _job_state_text,
    _node_result,
    _not_found_result,
    requeue_skip_note,
)
from relaunch.models import names
from relaunch.models.errors import InvalidStateError, JobNotFoundError, NodeNotFoundError
from relaunch.models.lineage import NONCE_KEY
from relaunch.models.scheduler import ActionResult, Job, JobState, Node, NodeFlag, NodeState


class FakeScheduler:
    """Nodes and jobs in memory; see the module docstring."""

    def __init__(self, *, nodes: Iterable[Node] = (), jobs: Iterable[Job] = ()) -> None:
        self.nodes: dict[str, Node] = {n.name: n for n in nodes}
        self.jobs: dict[str, Job] = {j.job_id: j for j in jobs}
        self.calls: list[tuple[Any, ...]] = []  # (method, *arguments), in call order
        self.drains: list[str] = []
        self.fences: list[str] = []
        self.resumes: list[str] = []
        self.requeues: list[str] = []
        self.holds: list[str] = []
        self.releases: list[str] = []
        self.exclusions: list[tuple[str, tuple[str, ...]]] = []
        self.cancels: list[str] = []
        self.submissions: list[str] = []  # ids of the jobs resubmit_job created
        self._next_id = max((int(j) for j in self.jobs if j.isdigit()), default=0) + 1

    # ------------------------------------------------------------ arranging the cluster

    def set_node(self, name: str, **changes: Any) -> Node:
        """Change a node (or add it) as Slurm would report it on the next read."""
        node = self.nodes.get(name) or Node(name=name)
        self.nodes[name] = node = node.model_copy(update=changes)
        return node

    def set_job(self, job_id: str, **changes: Any) -> Job:
        """Change a job (or add it) as Slurm would report it on the next read."""
        job = self.jobs.get(job_id) or Job(job_id=job_id)
        self.jobs[job_id] = job = job.model_copy(update=changes)
        return job

    def calls_to(self, method: str) -> list[tuple[Any, ...]]:
        """The arguments of every call of ``method``."""
        return [call[1:] for call in self.calls if call[0] == method]

    # ------------------------------------------------------------ reads

    async def list_jobs(self) -> list[Job]:
        self.calls.append(("list_jobs",))
        return list(self.jobs.values())

    async def list_jobs_brief(self) -> list[Job]:
        self.calls.append(("list_jobs_brief",))
        return [j.model_copy(update={"excluded_nodes": []}) for j in self.jobs.values()]

    async def get_job(self, job_id: str) -> Job:
        self.calls.append(("get_job", job_id))
        return self._job(job_id)

    async def get_job_brief(self, job_id: str) -> Job:
        """Like SlurmCli's: the brief listing has no excluded nodes."""
        self.calls.append(("get_job_brief", job_id))
        return self._job(job_id).model_copy(update={"excluded_nodes": []})

    async def list_nodes(self) -> list[Node]:
        self.calls.append(("list_nodes",))
        return list(self.nodes.values())

    async def get_node(self, name: str) -> Node:
        self.calls.append(("get_node", name))
        return self._node(name)

    async def batch_script(self, job_id: str) -> str:
        self.calls.append(("batch_script", job_id))
        return f"#!/bin/bash\n# the batch script of job {self._job(job_id).job_id}\n"

    def _job(self, job_id: str) -> Job:
        if job_id not in self.jobs:
            raise JobNotFoundError(f"job {job_id} not found")
        return self.jobs[job_id]

    def _node(self, name: str) -> Node:
        if name not in self.nodes:
            raise NodeNotFoundError(f"node {name} not found")
        return self.nodes[name]

    # ------------------------------------------------------------ node actions

    async def drain_node(self, name: str, reason: str) -> ActionResult:
        self.calls.append(("drain_node", name, reason))
        before = self._node(name)
        if before.drain_flag:
            note = f"already draining/drained: {before.reason or 'no reason'}"
            return _node_result("drain", before, before, changed=False, note=note)
        self.drains.append(name)
        flags = [NodeFlag.DRAIN.value, *before.flags]
        after = self.set_node(name, flags=flags, reason=reason)
        return _node_result("drain", before, after, changed=True)

    async def fence_node(self, name: str, reason: str) -> ActionResult:
        self.calls.append(("fence_node", name, reason))
        before = self._node(name)
        if before.state is NodeState.DOWN:
            return _node_result("fence", before, before, changed=False, note="already down")
        self.fences.append(name)
        after = self.set_node(name, state=NodeState.DOWN, reason=reason)
        return _node_result("fence", before, after, changed=True)

    async def resume_node(self, name: str) -> ActionResult:
        self.calls.append(("resume_node", name))
        before = self._node(name)
        if not before.drain_flag and before.responding:
            return _node_result("resume", before, before, changed=False, note="not drained")
        self.resumes.append(name)
        flags = [f for f in before.flags if f not in {NodeFlag.DRAIN, NodeFlag.NOT_RESPONDING}]
        state = NodeState.IDLE if before.state is NodeState.DOWN else before.state
        after = self.set_node(name, flags=flags, state=state, reason="")
        return _node_result("resume", before, after, changed=True)

    def prober(self, method: str = "auto") -> Prober:
        return make_prober("connect")  # never raw sockets in a test

    # ------------------------------------------------------------ job actions

    async def requeue_job(
        self, job_id: str, *, hold: bool = False, expected_restart_count: int | None = None
    ) -> ActionResult:
        self.calls.append(("requeue_job", job_id, hold, expected_restart_count))
        action = "requeue_hold" if hold else "requeue"
        before = self._job(job_id)
        if expected_restart_count is not None and before.restart_count > expected_restart_count:
            return _job_result(action, before, before, changed=False, note="already requeued")
        if before.state is JobState.PENDING:
            return _job_result(action, before, before, changed=False, note="already pending")
        if before.state is JobState.CANCELLED:
            raise InvalidStateError(f"job {job_id} was cancelled; it is not requeued")
        if not before.requeue_allowed and before.state.is_active:
            raise InvalidStateError(f"job {job_id} does not allow requeue")
        after = self._requeue(before, hold=hold)
        return _job_result(action, before, after, changed=True)

    async def requeue_jobs(self, expected: Mapping[str, int]) -> dict[str, ActionResult]:
        """Like SlurmCli's: each job decided as ``requeue_job`` with its expected restart count
        would, and a note instead of an error for a job that is not requeued."""
        wanted = {names.job_id(job_id): count for job_id, count in expected.items()}
        self.calls.append(("requeue_jobs", sorted(wanted)))
        results: dict[str, ActionResult] = {}
        for job_id, count in wanted.items():
            before = self.jobs.get(job_id)
            if before is None:
                results[job_id] = _not_found_result("requeue", job_id)
            elif note := requeue_skip_note(before, count):
                results[job_id] = _job_result("requeue", before, before, changed=False, note=note)
            else:
                after = self._requeue(before, hold=False)
                results[job_id] = _job_result("requeue", before, after, changed=True)
        return results

    def _requeue(self, before: Job, *, hold: bool) -> Job:
        """Requeue the job as Slurm would: pending again, one restart more."""
        self.requeues.append(before.job_id)
        return self.set_job(
            before.job_id,
            state=JobState.PENDING,
            reason="JobHeldAdmin" if hold else "BeginTime",
            nodes=[],
            batch_host="",
            restart_count=before.restart_count + 1,
        )

    async def hold_job(self, job_id: str) -> ActionResult:
        self.calls.append(("hold_job", job_id))
        before = self._job(job_id)
        if before.held:
            return _job_result("hold", before, before, changed=False, note="already held")
        if before.state is not JobState.PENDING:
            raise InvalidStateError(
                f"job {job_id} is {before.state.value}; only a pending job can be held"
            )
        self.holds.append(job_id)
        after = self.set_job(job_id, reason="JobHeldAdmin")
        return _job_result("hold", before, after, changed=True)

    async def release_job(self, job_id: str) -> ActionResult:
        self.calls.append(("release_job", job_id))
        before = self._job(job_id)
        if not before.held:
            return _job_result("release", before, before, changed=False, note="not held")
        self.releases.append(job_id)
        after = self.set_job(job_id, reason="None")
        return _job_result("release", before, after, changed=True)

    async def exclude_nodes(self, job_id: str, nodes: Sequence[str]) -> ActionResult:
        self.calls.append(("exclude_nodes", job_id, tuple(nodes)))
        before = self._job(job_id)
        missing = [n for n in nodes if n not in before.excluded_nodes]
        if not missing:
            return _job_result("exclude", before, before, changed=False, note="already excluded")
        if before.state is not JobState.PENDING:
            raise InvalidStateError(
                f"job {job_id} is {before.state.value}; nodes can be excluded only while pending"
            )
        self.exclusions.append((job_id, tuple(missing)))
        after = self.set_job(job_id, excluded_nodes=[*before.excluded_nodes, *missing])
        return _job_result("exclude", before, after, changed=True)

    async def cancel_job(self, job_id: str) -> ActionResult:
        self.calls.append(("cancel_job", job_id))
        before = self._job(job_id)
        if before.state.is_terminal:
            note = f"already {before.state.value}"
            return _job_result("cancel", before, before, changed=False, note=note)
        self.cancels.append(job_id)
        after = self.set_job(job_id, state=JobState.CANCELLED)
        return _job_result("cancel", before, after, changed=True)

    def resubmit_identity(self, job: Job) -> list[str]:
        """Every resubmission may run as the job's user here (SlurmCli's root case)."""
        return []

    async def resubmit_job(
        self, job_id: str, *, exclude: Sequence[str] = (), nonce: str | None = None
    ) -> ActionResult:
        self.calls.append(("resubmit_job", job_id, tuple(exclude)))
        before = self._job(job_id)
        if before.state.is_active:
            raise InvalidStateError(f"job {job_id} is still {before.state.value}")
        # Slurm's ids only grow: past any job a test added since.
        self._next_id = max(
            self._next_id, max((int(j) for j in self.jobs if j.isdigit()), default=0) + 1
        )
        new_id = str(self._next_id)
        self._next_id += 1
        fields = {
            k: v for k, v in before.comment_fields.items() if k not in (LINEAGE_KEY, NONCE_KEY)
        }
        fields[LINEAGE_KEY] = job_id
        if nonce is not None:
            fields[NONCE_KEY] = nonce
        child = self.set_job(
            new_id,
            **{
                **before.model_dump(exclude={"job_id"}),
                "state": JobState.PENDING,
                "reason": "None",
                "nodes": [],
                "batch_host": "",
                "restart_count": 0,
                "comment": ",".join(f"{k}={v}" for k, v in fields.items()),
                "excluded_nodes": list(dict.fromkeys([*before.excluded_nodes, *exclude])),
            },
        )
        self.submissions.append(new_id)
        return ActionResult(
            action="resubmit",
            target=job_id,
            changed=True,
            before=_job_state_text(before),
            after=_job_state_text(child),
            new_job_id=new_id,
        )


def _job_result(
    action: str, before: Job, after: Job, *, changed: bool, note: str = ""
) -> ActionResult:
    return ActionResult(
        action=action,
        target=before.job_id,
        changed=changed,
        note=note,
        before=_job_state_text(before),
        after=_job_state_text(after),
    )
