"""Shared parts of the fault-injection benchmark: private stacks, a timestamping job-log tail,
a job-state recorder, and cluster clean-up between runs."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from relaunch.connectors.slurm.commands import SlurmCli
from relaunch.devstack.slurm import slurmd_pid, start_daemons
from relaunch.devstack.stack import Stack, StackConfig
from relaunch.devstack.workload import EXAMPLES, TRAIN_SCRIPT
from relaunch.models.config import ClusterConfig, WatchSettings
from relaunch.models.errors import RelaunchError
from relaunch.models.lifecycle import LifecycleSettings
from relaunch.models.recovery import Policy
from relaunch.models.scheduler import JobState, NodeState

ROOT = Path(__file__).resolve().parents[2]
STEP = re.compile(r"step=(\d+) loss=")
RESUMED = re.compile(r"resumed from checkpoint step=(\d+)")
SAVED = re.compile(r"checkpoint saved step=(\d+)")


def submit_ddp(bs: BenchStack, *, workdir: Path, ckpt_dir: Path, args: list[str], port: int) -> str:
    """The DDP example (as devstack.workload.submit_training) with its own MASTER_PORT: two
    stacks side by side hand out the same job ids, and the default port derives from the id."""
    env = {
        **os.environ,
        **bs.s.slurm_env,
        "RELAUNCH_PYTHON": sys.executable,
        "RELAUNCH_EXAMPLES": str(EXAMPLES),
        "CKPT_DIR": str(ckpt_dir),
        "MASTER_PORT": str(port),
    }
    out = subprocess.run(
        ["sbatch", "--parsable", f"--output={workdir}/train-%j.out", "--comment=relaunch=on",
         f"--chdir={workdir}", str(TRAIN_SCRIPT), *args],
        env=env, capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip
    if out.returncode != 0:
        raise BenchError(f"sbatch of the DDP example failed: {out.stderr.strip()[-300:]}")
    return out.stdout.strip().split(";")[0]


def log(msg: str) -> None:
    print(f"[{datetime.now(UTC):%H:%M:%S}] {msg}", flush=True)


def now() -> datetime:
    return datetime.now(UTC)


class BenchError(RelaunchError):
    """The benchmark could not set up or observe a run."""


@dataclass
class LogTail:
    """Reads a job's output file every 0.1 s and stamps each new line with the wall clock."""

    path: Path
    lines: list[tuple[datetime, str]] = field(default_factory=list)
    _offset: int = 0
    _buf: str = ""
    _task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self.read()

    async def _run(self) -> None:
        while True:
            self.read()
            await asyncio.sleep(0.1)

    def read(self) -> None:
        if not self.path.exists():
            return
        with open(self.path, errors="replace") as fh:
            fh.seek(self._offset)
            chunk = fh.read()
            self._offset = fh.tell()
        if not chunk:
            return
        stamp = now()
        text = self._buf + chunk
        *complete, self._buf = text.split("\n")
        self.lines.extend((stamp, line) for line in complete)

    def max_step(self, before: datetime | None = None) -> int:
        steps = [
            int(m.group(1))
            for t, line in self.lines
            if (before is None or t <= before) and (m := STEP.search(line))
        ]
        return max(steps, default=0)

    def last_checkpoint(self) -> int:
        steps = [int(m.group(1)) for _, line in self.lines if (m := SAVED.search(line))]
        return max(steps, default=0)

    def first(self, pattern: re.Pattern[str] | str, after: datetime) -> tuple[datetime, str] | None:
        rx = re.compile(pattern) if isinstance(pattern, str) else pattern
        for t, line in self.lines:
            if t >= after and rx.search(line):
                return t, line
        return None

    def resume(self, after: datetime) -> tuple[int | None, datetime | None]:
        """The checkpoint step the next attempt resumed from, and when it printed its first
        training step."""
        found = self.first(RESUMED, after)
        if found is None:
            return None, None
        at, line = found
        m = RESUMED.search(line)
        step = self.first(STEP, at)
        return (int(m.group(1)) if m else None), (step[0] if step else None)

    def progress(self) -> list[tuple[datetime, int]]:
        """(time, highest step so far), for goodput plots."""
        out: list[tuple[datetime, int]] = []
        high = 0
        for t, line in self.lines:
            if m := STEP.search(line):
                step = int(m.group(1))
                out.append((t, step))
                high = max(high, step)
        return out

    async def wait(self, check: Callable[[LogTail], bool], what: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not check(self):
            if time.monotonic() > deadline:
                tail = "\n".join(line for _, line in self.lines[-15:])
                raise BenchError(f"{what}: not seen after {timeout:.0f}s in {self.path}:\n{tail}")
            await asyncio.sleep(0.1)


@dataclass
class JobWatch:
    """Polls one job every 0.25 s and records when it was first RUNNING again after a fault."""

    sched: SlurmCli
    job_id: str
    states: list[tuple[datetime, str, int, list[str]]] = field(default_factory=list)
    _task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _run(self) -> None:
        while True:
            with contextlib.suppress(RelaunchError):
                job = await self.sched.get_job(self.job_id)
                sample = (now(), job.state.value, job.restart_count, job.nodes)
                if not self.states or self.states[-1][1:3] != sample[1:3]:
                    self.states.append(sample)
            await asyncio.sleep(0.25)

    def running_again(self, after: datetime, restart_count: int) -> datetime | None:
        for t, state, restarts, _ in self.states:
            if t >= after and state == JobState.RUNNING.value and restarts > restart_count:
                return t
        return None

    def left_running(self, after: datetime) -> datetime | None:
        """When the job was first seen in a state other than RUNNING after ``after``."""
        for t, state, _, _ in self.states:
            if t >= after and state != JobState.RUNNING.value:
                return t
        return None


@dataclass
class BenchStack:
    """A private local stack on free ports; with ``relaunch`` its own worker and watcher."""

    root: Path
    name: str
    overrides: dict[str, object]
    policy: Policy | None = None
    watch: WatchSettings | None = None
    stack: Stack | None = None
    config: ClusterConfig | None = None
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    # Worker processes: with more than one, `relaunch worker --processes N` (a supervisor
    # parent and N children); with one, the plain `relaunch worker` as ever.
    workers: int = 1
    # The node lifecycle (relaunch/workflows/lifecycle.py): off unless a part measures it, so
    # that the other parts measure what they always did (a drained node stays drained).
    lifecycle: LifecycleSettings | None = None
    # Other fields of the stack's Relaunch configuration (e.g. launcher_health_pattern).
    config_updates: dict[str, object] = field(default_factory=dict)

    async def up(self) -> None:
        cfg = StackConfig.with_free_ports(cluster=self.name, services=False, **self.overrides)
        self.stack = Stack(self.root / self.name, cfg)
        await asyncio.to_thread(self.stack.up, lambda m: log(f"{self.name}: {m}"))
        self.config = self.stack.cluster_config()
        if self.policy is not None:
            self.config = self.config.model_copy(
                update={
                    "policy": self.policy,
                    "watch": self.watch or WatchSettings(),
                    "lifecycle": self.lifecycle or LifecycleSettings(enabled=False),
                    **self.config_updates,
                }
            )
            self.write_config()
            for node in self.stack.slurm.nodes:
                self.stack.node_log(node).parent.mkdir(parents=True, exist_ok=True)
                self.stack.node_log(node).touch()
            for proc in ("worker", "watch"):
                self.start_proc(proc)

    def write_config(self) -> None:
        """Write the stack's Relaunch configuration (what its worker and watcher read)."""
        (self.root / f"{self.name}.json").write_text(self.cfg.model_dump_json(indent=2))

    def start_proc(self, proc: str) -> subprocess.Popen[bytes]:
        """Start (or start again, after a kill) the stack's `relaunch worker` or `relaunch
        watch`, its output appended to <root>/<name>-<proc>.log."""
        argv = [
            sys.executable,
            "-m",
            "relaunch.cli",
            proc,
            "--config",
            str(self.root / f"{self.name}.json"),
        ]
        if proc == "worker" and self.workers > 1:
            argv += ["--processes", str(self.workers)]
        out = open(self.root / f"{self.name}-{proc}.log", "ab")  # noqa: SIM115
        self.procs[proc] = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT)
        return self.procs[proc]

    @property
    def s(self) -> Stack:
        assert self.stack is not None
        return self.stack

    @property
    def cfg(self) -> ClusterConfig:
        assert self.config is not None
        return self.config

    def sched(self) -> SlurmCli:
        return self.s.scheduler()

    def node_log(self, node: str) -> Path:
        return Path(str(self.cfg.node_log_pattern).format(node=node))

    def down(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=20)
            if proc.poll() is None:
                proc.kill()
        if self.stack is not None:
            try:
                self.stack.down()
            except RelaunchError as exc:
                log(f"{self.name}: down: {exc}")

    async def restore_nodes(self, timeout: float = 120) -> None:
        """Killed slurmds back, every node idle, answering and in service."""
        sched = self.sched()
        start_daemons(self.s.slurm)
        deadline = time.monotonic() + timeout
        silent: dict[str, float] = {}
        while True:
            nodes = await sched.list_nodes()
            unwell = [
                n for n in nodes if n.drain_flag or not n.responding or n.state is NodeState.DOWN
            ]
            if not unwell:
                return
            if time.monotonic() > deadline:
                raise BenchError(f"nodes not back: {[n.display_state for n in unwell]}")
            for node in unwell:
                if node.drain_flag or node.state is NodeState.DOWN:
                    with contextlib.suppress(RelaunchError):
                        await sched.resume_node(node.name)
                elif not node.responding:
                    silent.setdefault(node.name, time.monotonic())
                    if time.monotonic() - silent[node.name] > 5:
                        pid = slurmd_pid(self.s.slurm, node.name)
                        if pid:
                            os.kill(pid, signal.SIGTERM)
                            await asyncio.sleep(1)
                        start_daemons(self.s.slurm)
                        silent.pop(node.name)
            await asyncio.sleep(1)

    async def wait_idle(self, timeout: float = 90) -> None:
        sched = self.sched()
        deadline = time.monotonic() + timeout
        while True:
            nodes = await sched.list_nodes()
            if all(n.state is NodeState.IDLE and n.alloc_cpus == 0 for n in nodes):
                return
            if time.monotonic() > deadline:
                log(f"{self.name}: nodes not idle: {[n.display_state for n in nodes]}")
                return
            await asyncio.sleep(0.5)


async def until(check: Callable[[], Awaitable[bool]], what: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not await check():
        if time.monotonic() > deadline:
            raise BenchError(f"{what} after {timeout:.0f}s")
        await asyncio.sleep(0.25)


def pct(values: list[float], q: float) -> float:
    """Percentile by linear interpolation (nan for no values)."""
    vals = sorted(v for v in values if v == v)
    if not vals:
        return float("nan")
    k = (len(vals) - 1) * q / 100
    lo = int(k)
    hi = min(lo + 1, len(vals) - 1)
    return vals[lo] + (vals[hi] - vals[lo]) * (k - lo)
