"""A recovery harness on the session's real stack: a cluster configuration of its own (its own
task queue and incidents), a real worker and watcher as separate processes, the DDP example job,
and fault injection."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from temporalio.client import Client, WorkflowHandle

from relaunch.connectors.audit import AuditStore, StoredEvent
from relaunch.connectors.slurm.commands import SlurmCli
from relaunch.devstack import faults, procs
from relaunch.devstack.slurm import slurmd_pid, start_daemons
from relaunch.devstack.stack import SERVICE_READY, Stack
from relaunch.devstack.workload import ELASTIC_SCRIPT, submit_training
from relaunch.models.config import ClusterConfig, WatchSettings
from relaunch.models.lifecycle import LifecycleSettings
from relaunch.models.recovery import (
    TERMINAL_STAGES,
    Policy,
    RecoveryStatus,
    Stage,
    recovery_workflow_id,
)
from relaunch.models.scheduler import NodeState
from relaunch.workflows.recovery import RecoveryWorkflow

REPO = Path(__file__).resolve().parents[2]
# How long a process has to say it works (what it says: the dev stack's SERVICE_READY).
READY_TIMEOUT_S = 90.0
_names = itertools.count(1)


class Harness:
    def __init__(
        self, stack: Stack, tmp: Path, client: Client, audit: AuditStore, policy: Policy
    ) -> None:
        self.stack, self.tmp, self.client, self.audit = stack, tmp, client, audit
        self.sched: SlurmCli = stack.scheduler()
        name = f"e2e{os.getpid() % 1000}x{next(_names)}"
        self.config = ClusterConfig(
            name=name,
            **stack.slurm.config_fields,
            temporal_address=stack.temporal_address,
            temporal_ui=stack.temporal_ui,
            database_url=stack.database_url,
            bundle_dir=str(tmp / name / "bundles"),
            node_log_pattern=str(tmp / name / "nodes" / "{node}" / "kern.log"),
            launcher_health_pattern=str(tmp / name / "health" / "{node}"),
            policy=policy,
            # The active jobs every poll as well, the nodes every second: a test's job is seen
            # running within half a second, however loaded the shared machine (the cadence:
            # test_watch_cadence.py).
            watch=WatchSettings(poll_interval_s=0.5, active_interval_s=0.5, node_interval_s=1.0),
            # Tests share one Slurm: a drained node stays as the test left it (the lifecycle's
            # own tests turn it on: tests/integration/test_lifecycle.py).
            lifecycle=LifecycleSettings(enabled=False),
        )
        self.config_path = tmp / f"{name}.json"
        self.config_path.write_text(self.config.model_dump_json(indent=2))
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.jobs: list[str] = []

    def configure(self, **updates: object) -> None:
        """Change the cluster configuration the harness's processes will read."""
        self.config = self.config.model_copy(update=updates)
        self.config_path.write_text(self.config.model_dump_json(indent=2))

    # -------------------------------------------------------------- processes

    def start(self, name: str) -> None:
        """Start ``relaunch <name>`` and wait until it is ready: a fault injected before the
        watcher's first look, or a page asked of a console not yet listening, would test the
        machine's load instead of Relaunch."""
        path = self.tmp / f"{name}.log"
        offset = path.stat().st_size if path.exists() else 0
        log = open(path, "ab")  # noqa: SIM115 - owned by the process
        proc = self.procs[name] = subprocess.Popen(
            [sys.executable, "-m", "relaunch.cli", name, "--config", str(self.config_path)],
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=REPO,
        )
        deadline = time.monotonic() + READY_TIMEOUT_S
        while not self._ready(name, path, offset):
            if proc.poll() is not None or time.monotonic() > deadline:
                tail = path.read_text(errors="replace")[offset:][-2000:]
                raise AssertionError(f"relaunch {name} not ready (exit {proc.poll()}):\n{tail}")
            time.sleep(0.1)

    def _ready(self, name: str, log: Path, offset: int) -> bool:
        if name == "console":
            return procs.port_open(self.config.console.port)
        with open(log, "rb") as f:
            f.seek(offset)
            return SERVICE_READY[name].encode() in f.read()

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        proc = self.procs.pop(name, None)
        if proc and proc.poll() is None:
            proc.send_signal(sig)
            proc.wait(timeout=30)

    # -------------------------------------------------------------- jobs

    def submit_ddp(self, *args: str) -> str:
        job_id = submit_training(
            self.stack.slurm_env,
            workdir=self.tmp,
            ckpt_dir=self.tmp / self.config.name / "ckpt",
            args=["--step-sleep", "0.2", "--ckpt-every", "5", *args],
            # Tests share one Slurm: a harness's watcher and intake look after its jobs only.
            comment=f"relaunch=on,relaunch_cluster={self.config.name}",
        )
        self.jobs.append(job_id)
        return job_id

    def submit_elastic(self, *args: str, train_nodes: int = 2) -> str:
        """The DDP example under torchrun with a spare (examples/jobs/train_elastic.sbatch)."""
        job_id = submit_training(
            self.stack.slurm_env,
            workdir=self.tmp,
            ckpt_dir=self.tmp / self.config.name / "ckpt-elastic",
            args=["--step-sleep", "0.2", "--ckpt-every", "5", *args],
            comment=f"relaunch=on,relaunch_cluster={self.config.name},train_nodes={train_nodes}",
            script=ELASTIC_SCRIPT,
        )
        self.jobs.append(job_id)
        return job_id

    def log(self, job_id: str) -> str:
        path = self.tmp / f"train-{job_id}.out"
        return path.read_text(errors="replace") if path.exists() else ""

    async def wait_log(self, job_id: str, pattern: str, timeout: float = 90) -> re.Match[str]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            matches = list(re.finditer(pattern, self.log(job_id)))
            if matches:
                return matches[-1]
            await asyncio.sleep(0.3)
        raise AssertionError(f"no {pattern!r} in job {job_id}'s log:\n{self.log(job_id)[-2000:]}")

    def node_log(self, node: str) -> Path:
        return Path(self.config.node_log_pattern.format(node=node))  # type: ignore[union-attr]

    def inject_xid(self, node: str) -> None:
        path = self.node_log(node)
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a") as fh:
            fh.write(faults.xid79_line(node))

    def kill_node(self, node: str, job_id: str) -> None:
        faults.kill_node(self.stack.slurm, node, job_id=job_id, kernel_log=self.node_log(node))

    # -------------------------------------------------------------- recoveries

    def incident(self, job_id: str, attempt: int = 0) -> str:
        return recovery_workflow_id(self.config.name, job_id, attempt)

    def handle(self, incident: str) -> WorkflowHandle[RecoveryWorkflow, RecoveryStatus]:
        return self.client.get_workflow_handle_for(RecoveryWorkflow.run, incident)

    async def wait_stage(
        self, incident: str, stages: set[Stage], timeout: float = 120
    ) -> RecoveryStatus:
        deadline = time.monotonic() + timeout
        last: RecoveryStatus | None = None
        while time.monotonic() < deadline:
            try:
                last = await self.handle(incident).query(RecoveryWorkflow.status)
                if last.stage in stages:
                    return last
                if Stage.AWAITING_APPROVAL in stages and last.awaiting_approval:
                    return last  # its node decision awaits the approval (it covers the job)
                if last.stage in TERMINAL_STAGES:
                    raise AssertionError(
                        f"{incident} ended in {last.stage}: {last.outcome}; verdict "
                        f"{last.verdict.model_dump_json() if last.verdict else None}; plan reasons "
                        f"{last.plan.reasons if last.plan else None}"
                    )
            except Exception as exc:  # not started yet
                if isinstance(exc, AssertionError):
                    raise
            await asyncio.sleep(0.3)
        raise AssertionError(f"{incident} not in {stages} after {timeout}s (last: {last})")

    async def events(self, incident: str, kind: str | None = None) -> list[StoredEvent]:
        return [e for e in await self.audit.events(incident) if kind is None or e.kind == kind]

    async def stage_row(self, incident: str, stage: Stage, timeout: float = 30) -> StoredEvent:
        """The audit row of a stage: a query sees the stage as the workflow enters it, the row
        follows when its audit activity completes."""
        found: list[StoredEvent] = []

        async def written() -> bool:
            found[:] = [e for e in await self.events(incident, "stage") if e.stage == stage.value]
            return bool(found)

        await self.until(written, f"no {stage.value} stage row for {incident}", timeout)
        return found[-1]

    async def until(
        self, check: Callable[[], Awaitable[bool]], what: str, timeout: float = 60
    ) -> None:
        deadline = time.monotonic() + timeout
        while not await check():
            if time.monotonic() > deadline:
                raise AssertionError(f"{what} after {timeout}s")
            await asyncio.sleep(0.3)

    # -------------------------------------------------------------- cleanup

    async def stop(self) -> None:
        """Stop this harness's worker and watcher and cancel its jobs."""
        for name in list(self.procs):
            self.kill(name, signal.SIGTERM)
        for job_id in self.jobs:
            await self.sched.cancel_job(job_id)
        # And every job of this harness's cluster it did not submit itself (a resubmission
        # Relaunch made, a hostile user's job): none may hold a node after the test.
        for job in await self.sched.list_jobs():
            mine = job.comment_fields.get("relaunch_cluster") == self.config.name
            if mine and job.state.is_active and job.job_id not in self.jobs:
                with contextlib.suppress(Exception):
                    await self.sched.cancel_job(job.job_id)

    async def restore_nodes(self) -> None:
        """Bring back killed slurmds and return every node to service (after every harness of
        the test has stopped its jobs)."""
        start_daemons(self.stack.slurm)  # a killed slurmd comes back
        deadline = time.monotonic() + 90
        silent_since: dict[str, float] = {}
        # Leave the cluster as the next test expects it: every node idle, answering, in service.
        while True:
            nodes = await self.sched.list_nodes()
            unwell = [
                n
                for n in nodes
                if n.drain_flag or not n.responding or n.state is not NodeState.IDLE
            ]
            if not unwell:
                return
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"nodes not back in service: {[n.display_state for n in unwell]}"
                )
            for node in unwell:
                if node.drain_flag or node.state is NodeState.DOWN:
                    with contextlib.suppress(Exception):  # retried until the deadline
                        await self.sched.resume_node(node.name)
                elif not node.responding:
                    # slurmctld pinged the restarted slurmd before it could answer and will
                    # not ask again for SlurmdTimeout/3; a fresh registration clears the flag.
                    silent_since.setdefault(node.name, time.monotonic())
                    if time.monotonic() - silent_since[node.name] > 5:
                        pid = slurmd_pid(self.stack.slurm, node.name)
                        if pid:
                            os.kill(pid, signal.SIGTERM)
                            await asyncio.sleep(1)
                        start_daemons(self.stack.slurm)
                        silent_since.pop(node.name)
            await asyncio.sleep(1)
