"""The Slurm command-line backend (SlurmCli): reads over ``--json``, actions over
``scontrol``/``scancel``/``sbatch``.

Every action follows the same shape: read fresh state, decide whether anything needs doing (so a
retried call is harmless), act, then verify with a fresh read and report before/after.
"""

from __future__ import annotations

import asyncio
import logging
import os
import pwd
import re
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar

from relaunch.connectors.liveness import Prober, make_prober
from relaunch.connectors.slurm import accounting, parse
from relaunch.connectors.slurm.fresh import FreshRead
from relaunch.connectors.slurm.maintenance import NodeMaintenance
from relaunch.connectors.slurm.runner import (
    CONTROLLER_HINT,
    CommandResult,
    CommandRunner,
    LocalRunner,
    failure,
    raise_for_controller,
)
from relaunch.connectors.slurm.spares import SpareActions
from relaunch.models import names
from relaunch.models.errors import (
    ControllerUnavailableError,
    InvalidStateError,
    JobNotFoundError,
    NodeNotFoundError,
    ResubmitIdentityError,
    SchedulerError,
    VerificationError,
)
from relaunch.models.lineage import NONCE_KEY, checked_nonce
from relaunch.models.scheduler import ActionResult, Job, JobState, Node, NodeState

LINEAGE_KEY = "relaunch_parent"
log = logging.getLogger(__name__)
CANCEL_WAIT_S = 60.0  # how long a cancelled job may stay COMPLETING (its epilog)
REQUEUE_CHUNK = 200  # job ids per `scontrol requeue` of a batch (see SlurmCli.requeue_jobs)
# Every job state squeue accepts (22.05 and 24.11) but the pending ones (PENDING, RESV_DEL_HOLD):
# the jobs that run, ran or are ending. What the watcher follows between its full listings.
ACTIVE_STATES = (
    "RUNNING", "SUSPENDED", "COMPLETING", "COMPLETED", "CONFIGURING", "CANCELLED", "FAILED",
    "TIMEOUT", "NODE_FAIL", "PREEMPTED", "BOOT_FAIL", "DEADLINE", "OUT_OF_MEMORY", "RESIZING",
    "REQUEUED", "REQUEUE_FED", "REQUEUE_HOLD", "REVOKED", "SIGNALING", "SPECIAL_EXIT",
    "STAGE_OUT", "STOPPED",
)  # fmt: skip
# How scontrol 22.05 reports each job of a list it could not act on, one line per job on stderr:
# "Invalid job id specified for job 999999", "Job is pending execution for job 4".
_REFUSAL = re.compile(r"^(?P<error>.+) for job (?P<job_id>\S+)$")
# `scontrol ping`: "Slurmctld(primary) at ctl1 is DOWN" (a whole word: not POWER_DOWN).
_PING_DOWN = re.compile(r"\bis DOWN\b")
T = TypeVar("T")


class SlurmCli:
    """Slurm through its command-line clients.

    ``env`` is overlaid on the process environment for every command (typically ``SLURM_CONF``);
    ``runner`` replaces local execution (an SSH runner sends the same argv to the controller),
    and ``submit_as`` then names the account the commands run as there (what a resubmission
    may do depends on it: see :func:`resubmit_identity`).
    """

    def __init__(
        self,
        *,
        env: Mapping[str, str] | None = None,
        runner: CommandRunner | None = None,
        timeout: float = 30.0,
        verify_timeout: float = 10.0,
        submit_as: str | None = None,
    ) -> None:
        self._runner = runner or LocalRunner(env)
        self._submit_as = submit_as
        self._timeout = timeout
        self._verify_timeout = verify_timeout
        # Concurrent readers (a burst of recoveries, an action and its verification) share
        # squeue/sinfo calls; nobody gets a listing that started before it asked.
        self._job_reads: FreshRead[parse.JobListing] = FreshRead(self._read_jobs)
        self._node_reads: FreshRead[list[Node]] = FreshRead(self._read_nodes)
        self._brief_reads: FreshRead[parse.BriefListing] = FreshRead(self._read_brief)
        self._active_reads: FreshRead[parse.BriefListing] = FreshRead(self._read_active)
        self._brief_refused = ""  # why the last brief listing was refused, if it was
        self._nodes_from_scontrol = False  # set on the first sinfo answer of a newer release

    # ---------------------------------------------------------------- plumbing

    async def _run(self, argv: Sequence[str], *, stdin: str | None = None) -> CommandResult:
        result = await self._runner.run(argv, stdin=stdin, timeout=self._timeout)
        if result.returncode != 0:
            raise_for_controller(result)
        return result

    async def _checked(self, argv: Sequence[str], *, stdin: str | None = None) -> CommandResult:
        result = await self._run(argv, stdin=stdin)
        if result.returncode != 0:
            raise failure(result)
        return result

    async def _poll(
        self,
        read: Callable[[], Awaitable[T]],
        done: Callable[[T], bool],
        *,
        timeout: float | None = None,
    ) -> tuple[T, bool]:
        """Poll a fresh read until ``done`` holds or the verify timeout passes; the last value
        read, and whether ``done`` held for it."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + (self._verify_timeout if timeout is None else timeout)
        delay = 0.05
        while True:
            value = await read()
            if done(value):
                return value, True
            if loop.time() >= deadline:
                return value, False
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.5)

    async def _until(
        self,
        read: Callable[[], Awaitable[T]],
        done: Callable[[T], bool],
        what: str,
        *,
        timeout: float | None = None,
    ) -> T:
        """Poll a fresh read until ``done`` holds; VerificationError once the timeout passes."""
        value, ok = await self._poll(read, done, timeout=timeout)
        if not ok:
            seen = f" (last read: {_seen(value)})" if _seen(value) else ""
            raise VerificationError(f"{what}: not visible in a fresh read after the action{seen}")
        return value

    async def _past_completing(self, job_id: str, *, timeout: float | None = None) -> Job:
        """The job once it is no longer COMPLETING (after a requeue, or while its epilog runs)."""
        return await self._until(
            lambda: self.get_job(job_id),
            lambda j: j.state is not JobState.COMPLETING,
            f"job {job_id} to finish completing",
            timeout=timeout,
        )

    async def _json(self, argv: Sequence[str]) -> dict[str, Any]:
        """Run a ``--json`` read. Slurm 22.05 exits 0 and reports failures inside the JSON, so
        its ``errors`` are checked, and ``scontrol ping`` tells a dead controller apart."""
        result = await self._checked(argv)
        data = parse.load_json(result.stdout, argv[0])
        errors = parse.json_errors(data)
        if errors:
            ping = await self._runner.run(["scontrol", "ping"], timeout=self._timeout)
            if ping.returncode != 0 or _PING_DOWN.search(ping.stdout):
                raise ControllerUnavailableError(
                    f"{argv[0]}: the Slurm controller does not answer", hint=CONTROLLER_HINT
                )
            raise SchedulerError(f"{argv[0]} reported: {'; '.join(errors)[:300]}")
        return data

    # ---------------------------------------------------------------- reads

    async def list_jobs(self) -> list[Job]:
        """Every job slurmctld knows (pending, running and recently finished), one call shared
        by the callers that ask while it runs (see relaunch.connectors.slurm.fresh)."""
        return (await self._job_reads()).all()

    async def _read_jobs(self) -> parse.JobListing:
        # --states=all: 23.02 and later list only pending and running jobs without it (22.05's
        # JSON listed every state and ignores the option).
        data = await self._json(["squeue", "--json", "--states=all"])
        return parse.JobListing(data.get("jobs") or [])

    async def list_jobs_brief(self) -> list[Job]:
        """Every job, from squeue's text format: about 4x cheaper than ``squeue --json``,
        parsing included (0.74 s against 2.9 s at 10,500 jobs), for the watcher's polls. Jobs
        lack ``excluded_nodes``; actions use :meth:`list_jobs`. A listing that does not parse
        falls back to the JSON."""
        listing = await self._brief_reads()
        jobs = listing.all()
        cause = listing.why.partition(": ")[2]  # without the line number, which moves
        if cause != self._brief_refused:  # said once per cause, not at every poll
            self._brief_refused = cause
            if cause:
                log.info(
                    "squeue's text listing is not used (%s); reading squeue --json", listing.why
                )
        if jobs is None:
            # A newline or separator in a job's text (name, comment, paths): its user can make
            # each poll read the JSON listing, never make the text one say something else.
            return await self.list_jobs()
        return jobs

    async def list_jobs_active(self) -> list[Job]:
        """The jobs in any state but pending (see ``ACTIVE_STATES``), from squeue's text format
        with a state filter: what the watcher follows between its full listings. slurmctld
        still packs every job (squeue filters on its side), but only the active ones are
        printed and parsed: 0.06 s for 50 running jobs among 10,000 pending, against 0.7 s for
        all of them. Falls back to the full JSON listing, filtered, when it does not parse."""
        jobs = (await self._active_reads()).all()
        if jobs is None:
            return [job for job in await self.list_jobs() if job.state is not JobState.PENDING]
        return jobs

    async def get_job_brief(self, job_id: str) -> Job:
        """One job from the brief listing (shared and cheap, see :meth:`list_jobs_brief`), for
        loops that watch a job's state, nodes or restart count; ``excluded_nodes`` is empty.
        Falls back to :meth:`get_job` when the listing does not parse."""
        job_id = names.job_id(job_id)
        try:
            job = (await self._brief_reads()).get(job_id)
        except ValueError:  # the listing, or this job's line, does not parse
            return await self.get_job(job_id)
        if job is None:
            raise _job_not_found(job_id)
        return job

    async def _jobs(self, job_ids: Iterable[str]) -> dict[str, Job | None]:
        """The given jobs from one fresh full listing (None for a job it does not hold): what
        a batch action decides on."""
        listing = await self._job_reads()
        return {job_id: listing.get(job_id) for job_id in job_ids}

    async def _jobs_brief(self, job_ids: Iterable[str]) -> dict[str, Job | None]:
        """The given jobs from one fresh brief listing (cheap and shared, for a batch action's
        verification); from the full listing when the brief one does not parse."""
        job_ids = list(job_ids)
        listing = await self._brief_reads()
        try:
            return {job_id: listing.get(job_id) for job_id in job_ids}
        except ValueError:  # the listing, or one of these jobs' lines, does not parse
            return await self._jobs(job_ids)

    async def _read_brief(self, states: str = "all") -> parse.BriefListing:
        argv = [
            "env",
            "SLURM_TIME_FORMAT=%s",
            "squeue",
            f"--states={states}",
            "--noheader",
            f"--Format={parse.BRIEF_FORMAT}",
        ]
        return parse.BriefListing((await self._checked(argv)).stdout)

    async def _read_active(self) -> parse.BriefListing:
        return await self._read_brief(",".join(ACTIVE_STATES))

    async def get_job(self, job_id: str) -> Job:
        job_id = names.job_id(job_id)
        # squeue --json ignores -j in 22.05, so one listing serves a single job too.
        job = (await self._job_reads()).get(job_id)
        if job is None:
            raise _job_not_found(job_id)
        return job

    async def list_nodes(self) -> list[Node]:
        return list(await self._node_reads())

    async def ended_jobs(
        self, since: datetime, now: datetime, *, limit: int = accounting.MAX_ROWS
    ) -> accounting.EndedJobs:
        """Jobs that ended abnormally (accounting.ENDED_STATES) between ``since`` and ``now``,
        from Slurm's accounting (``sacct --json``, bounded: see connectors/slurm/accounting.py),
        oldest end first, at most ``limit``. AccountingDisabledError where the cluster keeps
        no accounting."""
        result = await self._run(accounting.sacct_argv(since, now))
        if result.returncode != 0:
            accounting.raise_disabled(result.stderr + result.stdout)
            raise failure(result)
        return accounting.ended_jobs(result.stdout, since=since, until=now, limit=limit)

    async def _read_nodes(self) -> list[Node]:
        if self._nodes_from_scontrol:
            return parse.nodes_from_data(await self._json(["scontrol", "show", "nodes", "--json"]))
        data = await self._json(["sinfo", "--json"])
        if "nodes" not in data and "sinfo" in data:
            # Slurm 23.02 and later: sinfo's JSON is grouped by partition and state; each node
            # is in `scontrol show nodes --json`, which 22.05 lacks.
            self._nodes_from_scontrol = True
            return await self._read_nodes()
        return parse.nodes_from_data(data)

    async def get_node(self, name: str) -> Node:
        name = names.node_name(name)
        for node in await self.list_nodes():
            if node.name == name:
                return node
        raise NodeNotFoundError(f"node {name} not found", hint="`sinfo -N` lists the nodes")

    async def batch_script(self, job_id: str) -> str:
        """The batch script the job was submitted with."""
        job_id = names.job_id(job_id)
        result = await self._run(["scontrol", "write", "batch_script", job_id, "-"])
        if result.returncode != 0:
            if "Invalid job id" in result.stderr:
                raise JobNotFoundError(f"job {job_id} not found")
            raise failure(result)
        return result.stdout

    # ---------------------------------------------------------------- node actions

    async def drain_node(self, name: str, reason: str) -> ActionResult:
        name, reason = names.node_name(name), names.reason(reason)
        before = await self.get_node(name)
        if before.drain_flag:
            return _node_result(
                "drain",
                before,
                before,
                changed=False,
                note=f"already draining/drained: {before.reason or 'no reason'}",
            )
        await self._checked(
            ["scontrol", "update", f"NodeName={name}", "State=DRAIN", f"Reason={reason}"]
        )
        after = await self._until(
            lambda: self.get_node(name), lambda n: n.drain_flag, f"drain {name}"
        )
        return _node_result("drain", before, after, changed=True)

    async def fence_node(self, name: str, reason: str) -> ActionResult:
        """Mark a node whose slurmd no longer answers DOWN, so that Slurm stops waiting for it
        (jobs stuck COMPLETING on it are released) instead of waiting for SlurmdTimeout."""
        name, reason = names.node_name(name), names.reason(reason)
        before = await self.get_node(name)
        if before.state is NodeState.DOWN:
            return _node_result("fence", before, before, changed=False, note="already down")
        await self._checked(
            ["scontrol", "update", f"NodeName={name}", "State=DOWN", f"Reason={reason}"]
        )
        after = await self._until(
            lambda: self.get_node(name), lambda n: n.state is NodeState.DOWN, f"fence {name}"
        )
        return _node_result("fence", before, after, changed=True)

    def prober(self, method: str = "auto") -> Prober:
        """The liveness prober for this cluster's nodes, probing from where the Slurm commands
        run: here, or on the SSH host (``relaunch.connectors.liveness``). Close it when done."""
        remote = None if isinstance(self._runner, LocalRunner) else self._runner
        return make_prober(method, runner=remote)

    def maintenance(self) -> NodeMaintenance:
        """A drained node's maintenance: reservation, commands on the node, reboot."""
        return NodeMaintenance(self)

    def spares(self) -> SpareActions:
        """A running job's spare-node restart: a node out of the job, its steps ended."""
        return SpareActions(self)

    async def resume_node(self, name: str) -> ActionResult:
        name = names.node_name(name)
        before = await self.get_node(name)
        if not before.drain_flag and before.responding:
            return _node_result("resume", before, before, changed=False, note="not drained")
        await self._checked(["scontrol", "update", f"NodeName={name}", "State=RESUME"])
        after = await self._until(
            lambda: self.get_node(name), lambda n: not n.drain_flag, f"resume {name}"
        )
        return _node_result("resume", before, after, changed=True)

    # ---------------------------------------------------------------- job actions

    def _job_result(
        self, action: str, before: Job, after: Job, *, changed: bool, note: str = ""
    ) -> ActionResult:
        return ActionResult(
            action=action,
            target=before.job_id,
            changed=changed,
            note=note,
            before=_job_state_text(before),
            after=_job_state_text(after),
        )

    async def requeue_job(
        self, job_id: str, *, hold: bool = False, expected_restart_count: int | None = None
    ) -> ActionResult:
        """Requeue a running or finished batch job. With ``expected_restart_count``, a job that
        was already requeued past that count is left alone (a retried call does nothing)."""
        job_id = names.job_id(job_id)
        action = "requeue_hold" if hold else "requeue"
        before = await self.get_job_brief(job_id)
        if expected_restart_count is not None and before.restart_count > expected_restart_count:
            return self._job_result(action, before, before, changed=False, note="already requeued")
        if before.state is JobState.PENDING:
            return self._job_result(action, before, before, changed=False, note="already pending")
        if before.state is JobState.CANCELLED:
            # Slurm requeues an ended batch job, a cancelled one too: that would undo whoever
            # cancelled it (a user, or a test's clean-up while a decision's batch was under way).
            raise InvalidStateError(f"job {job_id} was cancelled; it is not requeued")
        if not before.requeue_allowed and before.state.is_active:
            raise InvalidStateError(
                f"job {job_id} does not allow requeue",
                hint="submit it with --requeue, or restart it by resubmission",
            )
        await self._checked(["scontrol", "requeuehold" if hold else "requeue", job_id])
        after = await self._until(
            lambda: self.get_job_brief(job_id),
            # A requeued job may already be running again by the time we look.
            lambda j: j.restart_count > before.restart_count,
            f"requeue {job_id}",
        )
        return self._job_result(action, before, after, changed=True)

    async def requeue_jobs(self, expected: Mapping[str, int]) -> dict[str, ActionResult]:
        """Requeue many jobs at once (a failed rack's): one fresh brief read of all of them, one
        ``scontrol requeue`` per :data:`REQUEUE_CHUNK` ids, then polls of the brief listing
        until each requeued job's restart count has gone up.

        ``expected`` maps each job id to the restart count its caller saw; each job is decided
        as :meth:`requeue_job` with that ``expected_restart_count`` decides it, so a retried
        call requeues nothing twice. A job that is not requeued (not found, not allowed to be,
        refused by Slurm, or not seen requeued within the verify timeout) gets a result with
        ``changed=False`` and a note that says why, never an exception that would hide the
        other jobs' results. One result per requested id, in the order asked. Bad ids raise
        InvalidNameError before anything runs; a controller that does not answer raises
        ControllerUnavailableError (a retry then finds the jobs already requeued)."""
        wanted = {names.job_id(job_id): count for job_id, count in expected.items()}
        if not wanted:
            return {}
        results: dict[str, ActionResult] = {}
        to_requeue: dict[str, Job] = {}
        # The brief listing holds every field decided on (restart count, state, requeue) and
        # is as fresh as the JSON one (a read that starts after this call); at 10,000 queued
        # jobs it costs a quarter as much, and it falls back to the JSON when it does not parse.
        for job_id, before in (await self._jobs_brief(wanted)).items():
            if before is None:
                results[job_id] = _not_found_result("requeue", job_id)
            elif note := requeue_skip_note(before, wanted[job_id]):
                results[job_id] = self._job_result(
                    "requeue", before, before, changed=False, note=note
                )
            else:
                to_requeue[job_id] = before
        if to_requeue:
            refused = await self._send_requeues(list(to_requeue))
            results.update(await self._verify_requeues(to_requeue, refused))
        return {job_id: results[job_id] for job_id in wanted}

    async def _send_requeues(self, job_ids: Sequence[str]) -> dict[str, str]:
        """``scontrol requeue`` the jobs, :data:`REQUEUE_CHUNK` ids per command; Slurm's reason
        for each job it refused, by id. Slurm 22.05 requeues every job of a list that it can,
        exits 1 if any failed, and names each one that did on stderr (see ``_REFUSAL``)."""
        refused: dict[str, str] = {}
        for start in range(0, len(job_ids), REQUEUE_CHUNK):
            chunk = job_ids[start : start + REQUEUE_CHUNK]
            result = await self._run(["scontrol", "requeue", ",".join(chunk)])
            if result.returncode != 0:
                named = _refusals(result.stderr, chunk)
                if not named:  # no job named: the verification tells which were requeued
                    log.warning("%s", failure(result))
                refused.update(named)
        return refused

    async def _verify_requeues(
        self, befores: Mapping[str, Job], refused: Mapping[str, str]
    ) -> dict[str, ActionResult]:
        """Poll the brief listing until every job sent (and not refused) shows a higher
        restart count than before, or the verify timeout passes; a result for each job."""
        waiting = [job_id for job_id in befores if job_id not in refused]

        def done(jobs: Mapping[str, Job | None]) -> bool:
            return all(_requeued_since(befores[j], jobs[j]) for j in waiting)

        seen, _ = await self._poll(lambda: self._jobs_brief(befores), done)
        results: dict[str, ActionResult] = {}
        for job_id, before in befores.items():
            after = seen[job_id]
            if _requeued_since(before, after):
                # Refused, yet requeued: someone else's requeue got there first.
                note = "already requeued" if job_id in refused else ""
                changed = job_id not in refused
            else:
                why = refused.get(job_id) or f"no restart seen within {self._verify_timeout:g}s"
                last = _job_state_text(after) if after else "job gone"
                note, changed = f"not requeued: {why} (last read: {last})", False
                log.warning("job %s %s", job_id, note)
            results[job_id] = self._job_result(
                "requeue", before, after or before, changed=changed, note=note
            )
        return results

    # The commands behind hold/release/cancel; other transports (slurmrestd) override these and
    # keep the check-act-verify around them.
    async def _send_hold(self, job_id: str, *, held: bool) -> None:
        await self._checked(["scontrol", "hold" if held else "release", job_id])

    async def _send_cancel(self, job_id: str) -> None:
        await self._checked(["scancel", job_id])

    async def hold_job(self, job_id: str) -> ActionResult:
        job_id = names.job_id(job_id)
        before = await self.get_job(job_id)
        if before.held:
            return self._job_result("hold", before, before, changed=False, note="already held")
        if before.state is not JobState.PENDING:
            raise InvalidStateError(
                f"job {job_id} is {before.state.value}; only a pending job can be held"
            )
        await self._send_hold(job_id, held=True)
        after = await self._until(lambda: self.get_job(job_id), lambda j: j.held, f"hold {job_id}")
        return self._job_result("hold", before, after, changed=True)

    async def release_job(self, job_id: str) -> ActionResult:
        job_id = names.job_id(job_id)
        before = await self.get_job(job_id)
        if not before.held:
            return self._job_result("release", before, before, changed=False, note="not held")
        await self._send_hold(job_id, held=False)
        after = await self._until(
            lambda: self.get_job(job_id), lambda j: not j.held, f"release {job_id}"
        )
        return self._job_result("release", before, after, changed=True)

    async def exclude_nodes(self, job_id: str, nodes: Sequence[str]) -> ActionResult:
        """Add ``nodes`` to a pending job's excluded list (keeping the user's own exclusions)."""
        job_id = names.job_id(job_id)
        wanted = [names.node_name(n) for n in nodes]
        # Right after a requeue the job is COMPLETING for a moment before it is pending again.
        before = await self._past_completing(job_id)
        missing = [n for n in wanted if n not in before.excluded_nodes]
        if not missing:
            return self._job_result(
                "exclude", before, before, changed=False, note="already excluded"
            )
        if before.state is not JobState.PENDING:
            raise InvalidStateError(
                f"job {job_id} is {before.state.value}; nodes can be excluded only while pending"
            )
        merged = [*before.excluded_nodes, *missing]
        await self._checked(
            ["scontrol", "update", f"JobId={job_id}", f"ExcNodeList={','.join(merged)}"]
        )
        after = await self._until(
            lambda: self.get_job(job_id),
            lambda j: set(merged) <= set(j.excluded_nodes),
            f"exclude on {job_id}",
        )
        return self._job_result("exclude", before, after, changed=True)

    async def cancel_job(self, job_id: str) -> ActionResult:
        job_id = names.job_id(job_id)
        # COMPLETING is not always an end: a requeued job passes through it on its way back to
        # PENDING. So a cancel waits it out first, and is verified only by a terminal state.
        # Both waits allow for a loaded node's epilog, which can take well over 10 s.
        wait = max(self._verify_timeout, CANCEL_WAIT_S)
        before = await self._past_completing(job_id, timeout=wait)
        if before.state.is_terminal:
            return self._job_result(
                "cancel", before, before, changed=False, note=f"already {before.state.value}"
            )
        await self._send_cancel(job_id)
        after = await self._until(
            lambda: self.get_job(job_id),
            lambda j: j.state.is_terminal,
            f"cancel {job_id}",
            timeout=wait,
        )
        return self._job_result("cancel", before, after, changed=True)

    async def _with_output_patterns(self, job: Job) -> Job:
        """``job`` with its output patterns as submitted (``%j`` and all), from squeue's text
        for this one job: Slurm 23.02 and later print them expanded in JSON, where a
        resubmission would write into its parent's file. Kept as they are when the row does not
        parse (its own user put a separator or newline in them)."""
        sep = parse.BRIEF_SEPARATOR
        fields = ("JobID", "STDOUT", "STDERR", "JobID")
        result = await self._run(
            [
                "squeue",
                "--states=all",
                "--noheader",
                f"--jobs={job.job_id}",
                "--Format=" + ",".join(f"{f}:0{sep}" for f in fields),
            ]
        )
        patterns = (
            parse.output_patterns(result.stdout, job.job_id) if result.returncode == 0 else None
        )
        if patterns is None:
            return job
        return job.model_copy(update={"stdout_pattern": patterns[0], "stderr_pattern": patterns[1]})

    @property
    def submitter(self) -> Submitter:
        """Who runs ``sbatch``: the SSH account, or this process."""
        if self._submit_as is not None:
            return Submitter(name=self._submit_as)
        return Submitter(uid=os.geteuid())

    def resubmit_identity(self, job: Job) -> list[str]:
        """The sbatch options that make a resubmission of ``job`` run as the job's own user;
        ResubmitIdentityError when this submitter cannot (check before cancelling a job)."""
        return resubmit_identity(job, self.submitter)

    async def resubmit_job(
        self, job_id: str, *, exclude: Sequence[str] = (), nonce: str | None = None
    ) -> ActionResult:
        """Submit the job's batch script again as a new job, with the same shape, its user and
        ``relaunch_parent=<old id>`` (for people; nothing trusts it) and ``nonce`` (see
        relaunch/models/lineage.py) in its comment. Every call submits: finding a child an
        earlier call submitted is the caller's, from its own record (the restart step's audit
        trail), never from a comment any user can write."""
        job_id = names.job_id(job_id)
        excluded = [names.node_name(n) for n in exclude]
        # While COMPLETING, Slurm's record shrinks to the nodes still cleaning up, so the job's
        # shape (node count) is read only once it has fully ended.
        jobs = await self._until(
            self.list_jobs,
            lambda js: all(j.state is not JobState.COMPLETING for j in js if j.job_id == job_id),
            f"job {job_id} to finish completing",
        )
        by_id = {j.job_id: j for j in jobs}
        if job_id not in by_id:
            raise JobNotFoundError(f"job {job_id} not found")
        before = by_id[job_id]
        if before.state.is_active:
            raise InvalidStateError(
                f"job {job_id} is still {before.state.value}",
                hint="cancel it (or let it end) before resubmitting, so that two copies never run",
            )
        before = await self._with_output_patterns(before)
        argv = resubmit_argv(before, excluded, submitter=self.submitter, nonce=nonce)
        script = await self.batch_script(job_id)
        result = await self._checked(argv, stdin=script)
        new_id = parse.sbatch_job_id(result.stdout)
        child = await self._until(
            lambda: self.get_job(new_id), lambda j: True, f"resubmission of {job_id}"
        )
        return ActionResult(
            action="resubmit",
            target=job_id,
            changed=True,
            before=_job_state_text(before),
            after=_job_state_text(child),
            new_job_id=new_id,
        )


@dataclass(frozen=True)
class Submitter:
    """The identity ``sbatch`` runs as: this process (``uid``) or an SSH account (``name``)."""

    uid: int | None = None
    name: str | None = None

    @property
    def is_root(self) -> bool:
        return self.uid == 0 or self.name == "root"

    def is_owner_of(self, job: Job) -> bool:
        """Whether a job this identity submits runs as ``job``'s user without ``--uid``."""
        if self.uid is not None:
            if job.user_id is not None:
                return job.user_id == self.uid
            try:
                return bool(job.user) and pwd.getpwuid(self.uid).pw_name == job.user
            except KeyError:
                return False
        return self.name is not None and bool(job.user) and job.user == self.name


def resubmit_identity(job: Job, submitter: Submitter) -> list[str]:
    """``--uid``/``--gid`` of the job's user when the submitter is root (always given, from
    Slurm's record of the job), nothing when the submitter is that user; anything else would
    run the user's batch script as the submitting account, and is refused."""
    if submitter.is_root:
        if job.user_id is not None:
            uid = str(job.user_id)
        elif job.user:
            uid = names.user_name(job.user)
        else:
            raise ResubmitIdentityError(
                f"job {job.job_id}: Slurm lists no user for it, so a resubmission cannot be "
                "made to run as its owner; not resubmitted"
            )
        flags = [f"--uid={uid}"]
        if job.group_id is not None:
            flags.append(f"--gid={job.group_id}")
        return flags
    if submitter.is_owner_of(job):
        return []
    who = submitter.name or f"uid {submitter.uid}"
    owner = job.user or "an unknown user"
    if job.user_id is not None:
        owner += f" (uid {job.user_id})"
    raise ResubmitIdentityError(
        f"job {job.job_id} belongs to {owner}; Slurm commands run as {who}, which cannot pass "
        "--uid/--gid (only root can), so a resubmission would run the user's script as "
        f"{who}; not resubmitted",
        hint="run the Slurm commands as root (ssh.user: root) or use restart_method: requeue",
    )


def resubmit_argv(
    job: Job,
    exclude: Sequence[str],
    *,
    submitter: Submitter | None = None,
    nonce: str | None = None,
) -> list[str]:
    """The sbatch command that recreates ``job`` from its record, run as the job's user (see
    :func:`resubmit_identity`; ``submitter`` defaults to this process), with ``nonce`` in its
    comment when given; the script comes on stdin."""
    identity = resubmit_identity(job, submitter or Submitter(uid=os.geteuid()))
    # The parent's own lineage keys are never copied: they are this submission's to set.
    fields = {k: v for k, v in job.comment_fields.items() if k not in (LINEAGE_KEY, NONCE_KEY)}
    fields[LINEAGE_KEY] = job.job_id
    if nonce is not None:
        fields[NONCE_KEY] = checked_nonce(nonce)
    comment = names.comment(",".join(f"{k}={v}" for k, v in fields.items()))
    argv = ["sbatch", "--parsable", f"--comment={comment}", "--open-mode=append"]
    if job.name:
        argv.append(f"--job-name={job.name}")
    if job.partition:
        argv.append(f"--partition={names.partition(job.partition)}")
    if job.node_count:
        argv.append(f"--nodes={job.node_count}")
    if job.num_tasks:
        argv.append(f"--ntasks={job.num_tasks}")
    if job.time_limit_minutes:
        argv.append(f"--time={job.time_limit_minutes}")
    if job.work_dir:
        argv.append(f"--chdir={job.work_dir}")
    if job.stdout_pattern:
        argv.append(f"--output={job.stdout_pattern}")
    if job.stderr_pattern:
        argv.append(f"--error={job.stderr_pattern}")
    if job.requeue_allowed:
        argv.append("--requeue")
    # Names from Slurm's own record are validated too: nothing unchecked reaches sbatch.
    excluded = list(dict.fromkeys(names.node_name(n) for n in [*job.excluded_nodes, *exclude]))
    if excluded:
        argv.append(f"--exclude={','.join(excluded)}")
    return argv + identity


def _node_result(
    action: str, before: Node, after: Node, *, changed: bool, note: str = ""
) -> ActionResult:
    return ActionResult(
        action=action,
        target=before.name,
        changed=changed,
        note=note,
        before=before.display_state,
        after=after.display_state,
    )


def _job_state_text(job: Job) -> str:
    nodes = ",".join(job.nodes) or "-"
    return (
        f"{job.state.value} nodes={nodes} restarts={job.restart_count} reason={job.reason or '-'}"
    )


def requeue_skip_note(job: Job, expected_restart_count: int) -> str:
    """Why a batch requeue leaves ``job`` alone ("" when it should be requeued): the checks of
    :meth:`SlurmCli.requeue_job`, in its order, with its notes."""
    if job.restart_count > expected_restart_count:
        return "already requeued"
    if job.state is JobState.PENDING:
        return "already pending"
    if job.state is JobState.CANCELLED:
        return "cancelled: someone's decision, not undone by a requeue"
    if not job.requeue_allowed and job.state.is_active:
        return "does not allow requeue"
    return ""


def _requeued_since(before: Job, after: Job | None) -> bool:
    return after is not None and after.restart_count > before.restart_count


def _refusals(stderr: str, job_ids: Sequence[str]) -> dict[str, str]:
    """The jobs of ``job_ids`` that scontrol's stderr says it could not act on, with why."""
    asked = set(job_ids)
    refused: dict[str, str] = {}
    for line in stderr.splitlines():
        match = _REFUSAL.match(line.strip())
        if match and match["job_id"] in asked:
            refused[match["job_id"]] = match["error"]
    return refused


def _not_found_result(action: str, job_id: str) -> ActionResult:
    """The result of a batch action for a job the listing does not hold."""
    return ActionResult(action=action, target=job_id, changed=False, note="not found")


def _job_not_found(job_id: str) -> JobNotFoundError:
    return JobNotFoundError(
        f"job {job_id} not found", hint="finished jobs leave squeue after MinJobAge"
    )


def _seen(value: object) -> str:
    """What a verification last read, for its error message (a job or node; else nothing)."""
    if isinstance(value, Job):
        return f"job {value.job_id} {_job_state_text(value)}"
    if isinstance(value, Node):
        return f"node {value.name} {value.display_state} reason={value.reason or '-'}"
    return ""
