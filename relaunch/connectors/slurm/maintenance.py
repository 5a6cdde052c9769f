"""Node maintenance through the Slurm CLI: a maintenance reservation, commands run on a node
inside it (``srun``), a reboot, a drain reason. What a drained node's lifecycle does to it.

Each action reads fresh state first (a retried call changes nothing) and verifies after. Names
that reach a command line are validated; every command has a timeout.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from relaunch.connectors.slurm import parse
from relaunch.connectors.slurm.runner import CommandResult, failure, raise_for_controller
from relaunch.models import names
from relaunch.models.errors import SchedulerError, SchedulerTimeoutError
from relaunch.models.lifecycle import NodeJob
from relaunch.models.scheduler import ActionResult, JobState, Node

log = logging.getLogger(__name__)
if TYPE_CHECKING:
    from relaunch.connectors.slurm.commands import SlurmCli
_RESERVATION = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,80}")
_ENV_NAME = re.compile(r"[A-Z][A-Z0-9_]{0,63}")
# Slack on top of a command's own time limit, for srun to get an allocation and report.
SRUN_SLACK_S = 30.0


def reservation(value: str) -> str:
    if not _RESERVATION.fullmatch(value):
        raise ValueError(f"reservation name {value!r} is not valid")
    return value


# squeue's fields for the jobs on a node: only what Slurm writes (id, uid, state, reservation),
# never a name, comment or path a user chose, so that no job's text can shape a row.
NODE_JOBS_FORMAT = "%i %U %T %v"


def parse_node_jobs(text: str) -> list[NodeJob]:
    """The rows of ``squeue -h -w NODE -o NODE_JOBS_FORMAT``. A row that is not four fields
    still counts as a job of an unknown user (it keeps the checks waiting, never lets them
    start)."""
    jobs: list[NodeJob] = []
    for line in text.splitlines()[:10_000]:
        if not line.strip():
            continue
        parts = line.split()
        if len(parts) != 4 or not parts[1].isdigit():
            jobs.append(NodeJob(job_id=line.strip()[:40], uid=None, state=JobState.UNKNOWN))
            continue
        job_id, uid, state, resv = parts
        jobs.append(
            NodeJob(
                job_id=job_id[:40],
                uid=int(uid),
                state=JobState.parse(state),
                reservation="" if resv == "(null)" else resv[:80],
            )
        )
    return jobs


class RebootRefusedError(SchedulerError):
    """Slurm would not reboot the node (no RebootProgram configured, not permitted)."""


class NodeMaintenance:
    """What a node's lifecycle does to it through the Slurm CLI (local or over SSH) of
    ``cli``: see the module's docstring. ``SlurmCli.maintenance()`` makes one."""

    def __init__(self, cli: SlurmCli) -> None:
        self._cli = cli

    async def _run(self, argv: Sequence[str], *, timeout: float | None = None) -> CommandResult:
        cli = self._cli
        result = await cli._runner.run(argv, timeout=timeout or cli._timeout)
        if result.returncode != 0:
            raise_for_controller(result)
        return result

    async def get_node(self, name: str) -> Node:
        return await self._cli.get_node(name)

    async def jobs_on_node(self, node: str) -> list[NodeJob]:
        """Every job Slurm lists on ``node`` now (a fresh squeue: running, completing,
        suspended, ...), in the fields Slurm writes."""
        node = names.node_name(node)
        result = await self._run(["squeue", "-h", "-t", "all", "-w", node, "-o", NODE_JOBS_FORMAT])
        if result.returncode != 0:
            raise failure(result)
        return parse_node_jobs(result.stdout)

    async def reservation_nodes(self, name: str) -> list[str] | None:
        """The nodes of reservation ``name`` (as Slurm writes them), None when there is none."""
        name = reservation(name)
        result = await self._run(["scontrol", "show", "reservation", name])
        if result.returncode != 0:
            if "not found" in (result.stderr + result.stdout):
                return None
            raise failure(result)
        return parse.reservation_nodes(result.stdout)

    async def reserve_node(self, name: str, node: str, *, users: str = "root") -> ActionResult:
        """A maintenance reservation of ``node`` from now on, for ``users`` only: no other job
        starts there until it is removed (jobs already there go on: IGNORE_JOBS)."""
        name, node, users = reservation(name), names.node_name(node), names.user_name(users)
        before = await self.reservation_nodes(name)
        if before is not None:
            return ActionResult(
                action="reserve", target=node, changed=False, note=f"{name} exists already"
            )
        result = await self._run(
            [
                "scontrol",
                "create",
                "reservation",
                f"ReservationName={name}",
                f"Nodes={node}",
                "StartTime=now",
                "Duration=UNLIMITED",
                f"Users={users}",
                "Flags=MAINT,IGNORE_JOBS",
            ]
        )
        if result.returncode != 0:
            raise failure(result)
        after = await self.reservation_nodes(name)
        if after is None:
            raise SchedulerError(f"reservation {name} is not visible after its creation")
        return ActionResult(action="reserve", target=node, changed=True, note=f"{name} created")

    async def unreserve_node(self, name: str) -> ActionResult:
        """Remove the reservation ``name`` (none there: nothing to do)."""
        name = reservation(name)
        if await self.reservation_nodes(name) is None:
            return ActionResult(action="unreserve", target=name, changed=False, note="none")
        result = await self._run(["scontrol", "delete", f"ReservationName={name}"])
        if result.returncode != 0 and "not found" not in result.stderr:
            raise failure(result)
        if await self.reservation_nodes(name) is not None:
            raise SchedulerError(f"reservation {name} is still there after its removal")
        return ActionResult(action="unreserve", target=name, changed=True, note=f"{name} removed")

    async def run_on_node(
        self,
        node: str,
        argv: Sequence[str],
        *,
        reservation_name: str,
        timeout_s: float,
        job_name: str = "relaunch-check",
        env: Mapping[str, str] | None = None,
    ) -> tuple[int | None, str, float]:
        """Run ``argv`` on ``node`` as one Slurm step inside the reservation: (exit code, output,
        seconds); exit code None when it did not end within ``timeout_s`` (the step is then
        cancelled). The time limit Slurm enforces is the timeout too."""
        node = names.node_name(node)
        reservation(reservation_name)
        reservation(job_name)
        exports = ["ALL"]
        for key, value in (env or {}).items():
            if not _ENV_NAME.fullmatch(key) or "," in value or "\n" in value:
                raise ValueError(f"environment {key!r} cannot be passed to srun")
            exports.append(f"{key}={value}")
        minutes = max(1, int(timeout_s // 60) + 1)
        cmd = [
            "srun",
            f"--reservation={reservation_name}",
            f"--nodelist={node}",
            "--nodes=1",
            "--ntasks=1",
            f"--job-name={job_name}",
            f"--time={minutes}",
            "--immediate=30",
            f"--export={','.join(exports)}",
            "--",
            *argv,
        ]
        try:
            result = await self._run(cmd, timeout=timeout_s + SRUN_SLACK_S)
        except SchedulerTimeoutError:
            await self._run(["scancel", f"--name={job_name}", f"--nodelist={node}"])
            return None, f"no answer within {timeout_s:g}s (cancelled)", timeout_s
        output = result.stdout + (("\n" + result.stderr) if result.stderr.strip() else "")
        return result.returncode, output, result.seconds

    async def reboot_node(self, node: str, reason: str) -> ActionResult:
        """Ask Slurm to reboot ``node`` as soon as it is idle, back to service after (it stays
        in its maintenance reservation). RebootRefusedError where Slurm cannot reboot it."""
        node, reason = names.node_name(node), names.reason(reason)
        before = await self.get_node(node)
        if any(f.startswith("REBOOT") for f in before.flags):
            return ActionResult(
                action="reboot", target=node, changed=False, note="a reboot is pending already"
            )
        result = await self._run(
            ["scontrol", "reboot", "ASAP", "nextstate=RESUME", f"reason={reason}", node]
        )
        if result.returncode != 0:
            text = (result.stderr or result.stdout).strip()
            raise RebootRefusedError(f"Slurm refused to reboot {node}: {text[-200:]}")
        return ActionResult(action="reboot", target=node, changed=True, note="reboot requested")

    async def set_drain_reason(self, node: str, reason: str) -> ActionResult:
        """Drain ``node`` with ``reason`` (a drained node's reason is replaced)."""
        node, reason = names.node_name(node), names.reason(reason)
        before = await self.get_node(node)
        if before.drain_flag and before.reason == reason:
            return ActionResult(action="drain", target=node, changed=False, note="as asked")
        result = await self._run(
            ["scontrol", "update", f"NodeName={node}", "State=DRAIN", f"Reason={reason}"]
        )
        if result.returncode != 0:
            raise failure(result)
        after, ok = await self._cli._poll(
            lambda: self.get_node(node), lambda n: n.drain_flag and n.reason == reason
        )
        if not ok:
            raise SchedulerError(f"{node}: drain reason not visible after the update")
        return ActionResult(action="drain", target=node, changed=True, note=reason)
