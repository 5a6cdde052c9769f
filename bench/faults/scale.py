"""Scale: a burst of simultaneous interruptions, and the watcher's cost per poll with a large
queue, on a private 8-node stack whose nodes claim more CPUs (SlurmdParameters=config_overrides).

Burst: N one-CPU jobs (`sbatch --requeue --comment relaunch=on --wrap 'sleep 3600'`) fill nodes
n1–n4 (n5–n8 held out by a drain while they are placed, then returned to service); then n1–n4
fail at once (faults.kill_node: slurmd and every job process SIGKILLed, an Xid 79 line in each
node's kernel-log source). Every job's recovery is read back from the audit trail."""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import resource
import subprocess
import sys
import time
from datetime import datetime
from typing import Any

import psutil

from bench.faults.common import BenchError, BenchStack, log, now, pct
from relaunch.connectors.audit import AuditStore
from relaunch.devstack import faults, services
from relaunch.models.config import WatchSettings
from relaunch.models.recovery import Mode, Policy
from relaunch.models.scheduler import JobState
from relaunch.workers.watch_main import BriefSchedulerView
from relaunch.workers.watcher import WatchConfig, Watcher

SCALE_POLICY = Policy(
    mode=Mode.AUTONOMOUS,
    drain_cap=100,
    drain_share=1.0,
    restart_budget=100,
    verify_timeout_s=120,
)


def scale_stack(root: Any, burst: int, max_jobs: int) -> BenchStack:
    return BenchStack(
        root=root,
        name="scale",
        overrides={
            "nodes": 8,
            "node_cpus": max(2, math.ceil(burst / 4)),
            "cred_expire": 10,
            "max_job_count": max(20_000, max_jobs * 2),
        },
        policy=SCALE_POLICY,
        watch=WatchSettings(poll_interval_s=1.0),
    )


async def sh(bs: BenchStack, *argv: str, check: bool = True) -> str:
    proc = await asyncio.create_subprocess_exec(
        *argv,
        env={**os.environ, **bs.s.slurm_env},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await proc.communicate()
    if check and proc.returncode != 0:
        raise BenchError(f"{' '.join(argv[:3])}: {err.decode().strip()[-300:]}")
    return out.decode()


async def submit_many(bs: BenchStack, n: int, args: list[str], parallel: int = 12) -> list[str]:
    sem = asyncio.Semaphore(parallel)
    ids: list[str] = []

    async def one() -> None:
        async with sem:
            for attempt in range(6):
                try:
                    out = await sh(bs, "sbatch", "--parsable", *args)
                    ids.append(out.strip().split(";")[0])
                    return
                except BenchError:
                    await asyncio.sleep(0.5 * (attempt + 1))
            raise BenchError("sbatch kept failing")

    await asyncio.gather(*(one() for _ in range(n)))
    return ids


class Sampler:
    """CPU % and RSS of one process, every 0.5 s."""

    def __init__(self, pid: int) -> None:
        self.proc = psutil.Process(pid)
        self.samples: list[tuple[float, float, float]] = []
        self._task: asyncio.Task[None] | None = None
        self.cpu0 = self._cpu()

    def _cpu(self) -> float:
        t = self.proc.cpu_times()
        return t.user + t.system + t.children_user + t.children_system

    def start(self) -> None:
        self.proc.cpu_percent(None)
        self._task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(0.5)
            with contextlib.suppress(psutil.Error):
                rss = self.proc.memory_info().rss / 2**20
                self.samples.append((time.monotonic(), self.proc.cpu_percent(None), rss))

    async def stop(self) -> dict[str, float]:
        if self._task:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        cpu = [c for _, c, _ in self.samples]
        rss = [r for _, _, r in self.samples]
        return {
            "cpu_s": self._cpu() - self.cpu0,
            "cpu_pct_mean": sum(cpu) / len(cpu) if cpu else float("nan"),
            "cpu_pct_max": max(cpu, default=float("nan")),
            "rss_mib_max": max(rss, default=float("nan")),
            "rss_mib_start": rss[0] if rss else float("nan"),
        }


class StallProbe:
    """How the machine itself fares around the fault: a separate, otherwise idle process sleeps
    5 ms at a time and reports the longest gap between its wake-ups, and how busy both cores
    were (from /proc/stat) in each second. Killing a thousand processes at once on a 2-core VM
    loads everything on it, the watcher included; on a real cluster those processes die on the
    failed nodes, not beside Relaunch."""

    CODE = """
import json, signal, sys, time
def cpu():
    with open("/proc/stat") as fh:
        v = [int(x) for x in fh.readline().split()[1:]]
    return sum(v), v[3] + v[4]
worst, last = 0.0, time.monotonic()
busy, start, prev = [], last, cpu()
def done(*_):
    print(json.dumps({"worst": worst, "busy": busy}), flush=True)
    sys.exit(0)
signal.signal(signal.SIGTERM, done)
while True:
    time.sleep(0.005)
    t = time.monotonic()
    worst, last = max(worst, t - last), t
    if t - start >= len(busy) + 1:
        now = cpu()
        total, idle = now[0] - prev[0], now[1] - prev[1]
        busy.append(round(1 - idle / total, 3) if total else 0.0)
        prev = now
"""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc

    @classmethod
    async def start(cls) -> StallProbe:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-c", cls.CODE, stdout=asyncio.subprocess.PIPE
        )
        await asyncio.sleep(0.5)
        return cls(proc)

    async def stop(self) -> dict[str, Any]:
        """``stall_s``: the longest gap in seconds, less the probe's own 5 ms sleep;
        ``busy``: the share of both cores in use, second by second from the probe's start."""
        with contextlib.suppress(ProcessLookupError):
            self.proc.terminate()
        out, _ = await self.proc.communicate()
        try:
            seen = json.loads(out.decode())
        except ValueError:
            return {"stall_s": float("nan"), "busy": []}
        return {"stall_s": max(0.0, seen["worst"] - 0.005), "busy": seen["busy"]}


async def all_events(audit: AuditStore, kinds: list[str]) -> list[Any]:
    out: list[Any] = []
    last = 0
    while True:
        page = await audit.events_after(last, kinds, limit=5000)
        if not page:
            return out
        out.extend(page)
        last = page[-1].id


async def burst(bs: BenchStack, audit: AuditStore, n: int, wait_s: float) -> dict[str, Any]:
    sched = bs.sched()
    spare = bs.s.slurm.nodes[4:]
    failing = bs.s.slurm.nodes[:4]
    for node in spare:
        await sh(bs, "scontrol", "update", f"nodename={node}", "state=drain", "reason=bench-hold")
    t0 = time.monotonic()
    ids = await submit_many(
        bs,
        n,
        ["--requeue", "--comment=relaunch=on", "--output=/dev/null", "--wrap", "sleep 3600"],
    )
    submit_s = time.monotonic() - t0
    log(f"scale: {n} jobs submitted in {submit_s:.0f}s; waiting for them to run")

    async def running() -> int:
        return sum(
            1
            for j in await sched.list_jobs()
            if j.job_id in set(ids) and j.state is JobState.RUNNING
        )

    deadline = time.monotonic() + 300
    while (count := await running()) < n:
        if time.monotonic() > deadline:
            raise BenchError(f"only {count} of {n} burst jobs running")
        await asyncio.sleep(2)
    for node in spare:
        await sh(bs, "scontrol", "update", f"nodename={node}", "state=resume")
    await asyncio.sleep(3)  # the watcher has seen every job running
    worker = Sampler(bs.procs["worker"].pid)
    watcher = Sampler(bs.procs["watch"].pid)
    temporal_pid = services.temporal_pid(bs.s.temporal_root)
    temporal = Sampler(temporal_pid) if temporal_pid else None
    worker.start()
    watcher.start()
    if temporal:
        temporal.start()
    placed = {j.job_id: j.nodes[0] for j in await sched.list_jobs() if j.job_id in set(ids)}
    # Find every victim first (a scan of /proc takes seconds and stalls this 2-core machine),
    # let the machine settle, then fail the nodes together.
    victims = {node: faults.node_processes(bs.s.slurm, node) for node in failing}
    await asyncio.sleep(5)
    probe = await StallProbe.start()
    fault_at = now()
    killed = 0
    node_fault: dict[str, datetime] = {}
    for node in failing:
        killed += faults.kill_pids(node, victims[node], kernel_log=bs.node_log(node))
        node_fault[node] = now()
    log(f"scale: killed {killed} processes on {','.join(failing)}; waiting for {n} recoveries")
    await asyncio.sleep(10)
    stall = await probe.stop()
    deadline = time.monotonic() + wait_s
    restarted: dict[str, datetime] = {}
    while time.monotonic() < deadline:
        actions = await all_events(audit, ["action"])
        restarted = {
            e.incident_id: e.at for e in actions if str(e.data.get("step", "")) == "restart"
        }
        if len(restarted) >= n:
            break
        await asyncio.sleep(3)
    handled_s = (now() - fault_at).total_seconds()
    await asyncio.sleep(2)
    cpu_worker = await worker.stop()
    cpu_watcher = await watcher.stop()
    cpu_temporal = await temporal.stop() if temporal else None
    dets = await all_events(audit, ["detection"])
    acts = await all_events(audit, ["action"])
    stages = await all_events(audit, ["stage"])
    first_det: dict[str, datetime] = {}
    for e in dets:
        at = datetime.fromisoformat(str(e.data["detected_at"]))
        first_det[e.incident_id] = min(first_det.get(e.incident_id, at), at)
    first_act: dict[str, datetime] = {}
    for e in acts:
        first_act[e.incident_id] = min(first_act.get(e.incident_id, e.at), e.at)
    det_s = [
        (t - node_fault[placed[job]]).total_seconds()
        for i, t in first_det.items()
        if (job := i.rsplit("-", 2)[-2]) in placed
    ]
    act_s = [(first_act[i] - first_det[i]).total_seconds() for i in first_act if i in first_det]
    rst_s = [(restarted[i] - first_det[i]).total_seconds() for i in restarted if i in first_det]
    final: dict[str, str] = {}
    for e in stages:
        final[e.incident_id] = str(e.stage)
    # Where the time between detection and action goes: each milestone's first row, from the
    # incident's first detection.
    milestones: dict[str, dict[str, datetime]] = {}
    for e in [*stages, *await all_events(audit, ["evidence", "verdict", "plan"]), *acts]:
        key = f"stage:{e.stage}" if e.kind == "stage" else e.kind
        first = milestones.setdefault(key, {})
        first[e.incident_id] = min(first.get(e.incident_id, e.at), e.at)
    breakdown = {}
    for key, at in sorted(milestones.items()):
        spans = [(t - first_det[i]).total_seconds() for i, t in at.items() if i in first_det]
        breakdown[key] = {"n": len(spans), "p50": pct(spans, 50), "p95": pct(spans, 95)}
    drained = sorted(n.name for n in await sched.list_nodes() if n.drain_flag)
    jobs = {j.job_id: j for j in await sched.list_jobs() if j.job_id in set(ids)}
    running_again = sum(
        1 for j in jobs.values() if j.state is JobState.RUNNING and j.restart_count >= 1
    )
    return {
        "jobs": n,
        "submit_s": submit_s,
        "killed_processes": killed,
        "kill_spread_s": (max(node_fault.values()) - fault_at).total_seconds(),
        "stall_s": stall["stall_s"],
        "busy_after_fault": stall["busy"],
        "incidents": len(first_det),
        "restarted": len(restarted),
        "running_again": running_again,
        "handled_s": handled_s,
        "detect_p50": pct(det_s, 50),
        "detect_p95": pct(det_s, 95),
        "action_p50": pct(act_s, 50),
        "action_p95": pct(act_s, 95),
        "restart_p50": pct(rst_s, 50),
        "restart_p95": pct(rst_s, 95),
        "restart_max": max(rst_s, default=float("nan")),
        "stages": {s: list(final.values()).count(s) for s in set(final.values())},
        "since_detection": breakdown,
        "drained": drained,
        "false_drains": [d for d in drained if d not in failing],
        "worker": cpu_worker,
        "watcher": cpu_watcher,
        "temporal": cpu_temporal,
        "det_samples": det_s,
        "act_samples": act_s,
    }


async def watcher_cost(bs: BenchStack, n: int, polls: int) -> dict[str, Any]:
    """``n`` held, opted-in jobs in the queue; time Watcher.poll_once and its two reads, and
    the real watcher process's CPU while it polls every second."""
    sched = bs.sched()
    t0 = time.monotonic()
    await submit_many(
        bs,
        n,
        [
            "--hold",
            "--comment=relaunch=on",
            "--job-name=held",
            "--output=/dev/null",
            "--wrap",
            "true",
        ],
        parallel=16,
    )
    submit_s = time.monotonic() - t0
    records = len(await sched.list_jobs())
    log(f"scale: {n} held jobs submitted in {submit_s:.0f}s; squeue holds {records} records")

    async def noop(_: Any) -> None:
        return None

    cfg = bs.cfg
    watcher = Watcher(
        WatchConfig(cluster=cfg.name, node_log_pattern=cfg.node_log_pattern),
        BriefSchedulerView(sched),  # as `relaunch watch` reads the queue
        noop,
    )

    def usage() -> float:
        s = resource.getrusage(resource.RUSAGE_SELF)
        c = resource.getrusage(resource.RUSAGE_CHILDREN)
        return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime

    async def timed(fn: Any) -> tuple[float, float]:
        c0, w0 = usage(), time.perf_counter()
        await fn()
        return time.perf_counter() - w0, usage() - c0

    first = await timed(watcher.poll_once)
    poll = [await timed(watcher.poll_once) for _ in range(polls)]
    jobs = [await timed(sched.list_jobs_brief) for _ in range(polls)]
    jobs_json = [await timed(sched.list_jobs) for _ in range(polls)]
    nodes = [await timed(sched.list_nodes) for _ in range(polls)]
    real = Sampler(bs.procs["watch"].pid)
    real.start()
    await asyncio.sleep(20)
    real_cpu = await real.stop()
    return {
        "held_jobs": n,
        "records": records,
        "submit_s": submit_s,
        "first_poll_ms": first[0] * 1000,
        "poll_ms_p50": pct([p[0] for p in poll], 50) * 1000,
        "poll_ms_p95": pct([p[0] for p in poll], 95) * 1000,
        "poll_cpu_ms_p50": pct([p[1] for p in poll], 50) * 1000,
        "squeue_ms_p50": pct([p[0] for p in jobs], 50) * 1000,
        "squeue_cpu_ms_p50": pct([p[1] for p in jobs], 50) * 1000,
        "squeue_json_ms_p50": pct([p[0] for p in jobs_json], 50) * 1000,
        "squeue_json_cpu_ms_p50": pct([p[1] for p in jobs_json], 50) * 1000,
        "sinfo_ms_p50": pct([p[0] for p in nodes], 50) * 1000,
        "watch_process": real_cpu,
        "polls": polls,
    }


def cancel_all(bs: BenchStack) -> None:
    with contextlib.suppress(Exception):
        subprocess.run(
            ["scancel", "--full", "-u", "root"],
            env={**os.environ, **bs.s.slurm_env},
            capture_output=True,
            timeout=120,
            check=False,
        )
