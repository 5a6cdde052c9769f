"""Scale: a burst of simultaneous interruptions, and the watcher's cost per poll with a large
queue, on a private 8-node stack whose nodes claim more CPUs (SlurmdParameters=config_overrides).

Burst: N one-CPU jobs (`sbatch --requeue --comment relaunch=on --wrap 'sleep 3600'`) fill nodes
n1–n4 (n5–n8 held out by a drain while they are placed, then returned to service); then n1–n4
fail at once (faults.kill_node: slurmd and every job process SIGKILLed, an Xid 79 line in each
node's kernel-log source). Every job's recovery is read back from the audit trail:

- per job: fault → first detection; detection → first action (its own first `action` row, or
  the drain of a node decision it joined, counted 0 when the node was drained before the job
  was detected); detection → requeue (its `action` step=restart row that changed the job);
- per node decision (``relaunch-<cluster>-node-<node>-<n>``): fault → drain, the node's first
  detection → drain, its requeue batches; per node, the drains that changed it (exactly one);
- the audit trail of each job incident, the node decision's id in a sample of the job
  workflows' Temporal histories, and each job requeued exactly once (Slurm's restart count and
  the restart rows).

Variants: ``trust`` (n4 stays up and only its jobs die, after each printed an Xid line in its
own output: job-controlled evidence, which must not drain n4) and ``kill`` (the worker is
SIGKILLed a few seconds after the fault, while requeues are in flight)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import random
import re
import resource
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import datetime
from typing import Any

import psutil
from temporalio.client import Client

from bench.faults.common import BenchError, BenchStack, log, now, pct
from relaunch.connectors.audit import AuditStore
from relaunch.devstack import faults, services
from relaunch.models.config import WatchSettings
from relaunch.models.node_decision import parse_node_decision_id
from relaunch.models.recovery import Mode, Policy
from relaunch.models.scheduler import JobState
from relaunch.models.search_attributes import TERMINAL_STAGES
from relaunch.workers.watch_main import BriefSchedulerView
from relaunch.workers.watcher import WatchConfig, Watcher

SCALE_POLICY = Policy(
    mode=Mode.AUTONOMOUS,
    drain_cap=100,
    drain_share=1.0,
    restart_budget=100,
    verify_timeout_s=120,
)


def scale_stack(root: Any, burst: int, max_jobs: int, workers: int = 1) -> BenchStack:
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
        workers=workers,
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
    """CPU % and RSS of one process, every 0.5 s; with ``tree``, of a supervisor and its
    children (`relaunch worker --processes N`). ``pid`` may be a callable, asked at every
    sample, so that a worker killed and started again is followed.

    CPU-s is the sum over every process seen of its last-read CPU time less its CPU time at
    the start (0 for a process that started later): a process that died keeps what it had
    used up to its last sample (at most 0.5 s of it is lost). Each worker's time includes its
    reaped children (`squeue`, `scontrol`); a supervisor's own count leaves its children's out,
    since they are counted themselves (its `children_*` times would count a reaped worker a
    second time)."""

    def __init__(self, pid: int | Callable[[], int], *, tree: bool = False) -> None:
        self._pid: Callable[[], int] = pid if callable(pid) else (lambda: pid)
        self.tree = tree
        self.samples: list[tuple[float, float, float]] = []
        self._task: asyncio.Task[None] | None = None
        self._procs: dict[int, psutil.Process] = {}
        self._base: dict[int, float] = {}
        self._last: dict[int, float] = {}
        self._started = False
        self._look()

    def _members(self) -> list[tuple[psutil.Process, bool]]:
        """The processes sampled now, each with whether it is the root."""
        pid = self._pid()
        if pid not in self._procs:
            self._procs[pid] = psutil.Process(pid)
        root = self._procs[pid]
        out = [(root, True)]
        if self.tree:
            # The supervisor's own children (the worker processes): their children (short-lived
            # `squeue` and such) are counted in each worker's children_* times once reaped.
            out += [(self._procs.setdefault(c.pid, c), False) for c in root.children()]
        return out

    def _look(self) -> tuple[float, float]:
        """Read every member's CPU time; the CPU % (summed) and RSS MiB (summed) now."""
        pct_now = rss = 0.0
        with contextlib.suppress(psutil.Error):
            for proc, is_root in self._members():
                with contextlib.suppress(psutil.Error):
                    t = proc.cpu_times()
                    cpu = t.user + t.system
                    if not (self.tree and is_root):
                        cpu += t.children_user + t.children_system
                    self._base.setdefault(proc.pid, cpu if not self._started else 0.0)
                    self._last[proc.pid] = cpu
                    pct_now += proc.cpu_percent(None)
                    rss += proc.memory_info().rss / 2**20
        return pct_now, rss

    def _cpu(self) -> float:
        return sum(self._last[p] - self._base.get(p, 0.0) for p in self._last)

    def start(self) -> None:
        self._started = True
        self._task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(0.5)
            cpu, rss = self._look()
            if rss:
                self.samples.append((time.monotonic(), cpu, rss))

    async def stop(self) -> dict[str, float]:
        if self._task:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self._look()
        cpu = [c for _, c, _ in self.samples]
        rss = [r for _, _, r in self.samples]
        return {
            "cpu_s": self._cpu(),
            "cpu_pct_mean": sum(cpu) / len(cpu) if cpu else float("nan"),
            "cpu_pct_max": max(cpu, default=float("nan")),
            "rss_mib_max": max(rss, default=float("nan")),
            "rss_mib_start": rss[0] if rss else float("nan"),
            "processes": len(self._last),
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


VARIANTS = ("plain", "trust", "kill")
# The line n4's jobs print in the trust burst: an Xid in the job's own output, which the job
# controls (any program can print it), so it names n4 on untrusted evidence only.
JOB_XID = "NVRM: Xid (PCI:0000:3b:00): 79, pid={pid}, name=python3, GPU has fallen off the bus.\n"
HISTORY_SAMPLE = 20  # job workflows whose Temporal history is read for their node decision


async def burst(
    bs: BenchStack,
    audit: AuditStore,
    n: int,
    wait_s: float,
    *,
    variant: str = "plain",
    kill_after: float = 4.0,
    settle_s: float = 60.0,
) -> dict[str, Any]:
    """The burst (see the module's docstring). ``variant``: ``plain``; ``trust`` (n4's jobs
    die after printing an Xid line in their own output, n4 itself stays up: job-controlled
    evidence that must not drain it); ``kill`` (the worker is SIGKILLed ``kill_after`` s after
    the fault: the single process, started again at once the way the stack started it, or with
    several, one child, which its supervisor restarts). After every job was requeued (or
    ``wait_s``), up to ``settle_s`` more for the recoveries to finish verifying."""
    if variant not in VARIANTS:
        raise BenchError(f"unknown burst variant {variant!r}")
    sched = bs.sched()
    spare = bs.s.slurm.nodes[4:]
    failing = bs.s.slurm.nodes[:4]
    # The nodes that fail with trusted evidence (their kernel log): each is drained once.
    trusted = failing[:3] if variant == "trust" else failing
    out_dir = bs.root / "out"
    if variant == "trust":
        out_dir.mkdir(exist_ok=True)
        out_dir.chmod(0o777)
    output = f"--output={out_dir}/%j.out" if variant == "trust" else "--output=/dev/null"
    for node in spare:
        await sh(bs, "scontrol", "update", f"nodename={node}", "state=drain", "reason=bench-hold")
    t0 = time.monotonic()
    ids = await submit_many(
        bs, n, ["--requeue", "--comment=relaunch=on", output, "--wrap", "sleep 3600"]
    )
    id_set = set(ids)
    submit_s = time.monotonic() - t0
    log(f"scale: {n} jobs submitted in {submit_s:.0f}s; waiting for them to run")

    async def running() -> int:
        return sum(
            1 for j in await sched.list_jobs() if j.job_id in id_set and j.state is JobState.RUNNING
        )

    deadline = time.monotonic() + 300
    while (count := await running()) < n:
        if time.monotonic() > deadline:
            raise BenchError(f"only {count} of {n} burst jobs running")
        await asyncio.sleep(2)
    for node in spare:
        await sh(bs, "scontrol", "update", f"nodename={node}", "state=resume")
    await asyncio.sleep(3)  # the watcher has seen every job running
    worker = Sampler(lambda: bs.procs["worker"].pid, tree=bs.workers > 1)
    watcher = Sampler(bs.procs["watch"].pid)
    temporal_pid = services.temporal_pid(bs.s.temporal_root)
    temporal = Sampler(temporal_pid) if temporal_pid else None
    worker.start()
    watcher.start()
    if temporal:
        temporal.start()
    placed = {j.job_id: j.nodes[0] for j in await sched.list_jobs() if j.job_id in id_set}
    # Find every victim first (a scan of /proc takes seconds and stalls this 2-core machine),
    # let the machine settle, then fail the nodes together. A node failing on job-controlled
    # evidence only (the trust burst's n4) keeps its slurmd: only its jobs' processes die.
    victims = {
        node: faults.node_processes(bs.s.slurm, node)
        if node in trusted
        else [p.pid for p in faults.job_processes(bs.s.slurm, node)]
        for node in failing
    }
    await asyncio.sleep(5)
    check_alive(bs)
    probe = await StallProbe.start()
    fault_at = now()
    killed = 0
    node_fault: dict[str, datetime] = {}
    for node in failing:
        if node in trusted:
            killed += faults.kill_pids(node, victims[node], kernel_log=bs.node_log(node))
        else:
            for job, where in placed.items():
                if where == node:
                    with open(out_dir / f"{job}.out", "a") as fh:
                        fh.write(JOB_XID.format(pid=4000 + int(job) % 1000))
            killed += faults.kill_pids(node, victims[node])
        node_fault[node] = now()
    log(f"scale: killed {killed} processes on {','.join(failing)}; waiting for {n} recoveries")
    kill_task = (
        asyncio.create_task(kill_worker(bs, audit, kill_after, fault_at))
        if variant == "kill"
        else None
    )
    await asyncio.sleep(10)
    stall = await probe.stop()
    deadline = time.monotonic() + wait_s
    requeued_jobs: set[str] = set()
    while time.monotonic() < deadline:
        requeued_jobs = {
            job
            for e in await all_events(audit, ["action"])
            if e.data.get("step") == "restart"
            and e.data.get("changed")
            and (job := job_of(e.incident_id)) in id_set
        }
        if len(requeued_jobs) >= n and (kill_task is None or kill_task.done()):
            break
        if kill_task is None or kill_task.done():
            check_alive(bs)
        await asyncio.sleep(3)
    handled_s = (now() - fault_at).total_seconds()
    kill = await kill_task if kill_task is not None else None
    await asyncio.sleep(2)
    cpu_worker = await worker.stop()
    cpu_watcher = await watcher.stop()
    cpu_temporal = await temporal.stop() if temporal else None
    # The recoveries verify their jobs (RUNNING again on n5–n8): give them a while to finish.
    settle_start = time.monotonic()
    while time.monotonic() - settle_start < settle_s:
        last = last_stages(await all_events(audit, ["stage"]))
        open_jobs = [i for i, st in last.items() if job_of(i) in id_set and st not in FINAL]
        if not open_jobs:
            break
        await asyncio.sleep(3)
    settled_s = time.monotonic() - settle_start
    kinds = [
        "detection",
        "evidence",
        "verdict",
        "plan",
        "node_decision",
        "action",
        "stage",
        "verify",
    ]
    rows = await all_events(audit, kinds)
    rows += await all_events(audit, ["requeue_batch"])
    jobs = {j.job_id: j for j in await sched.list_jobs() if j.job_id in id_set}
    drained = sorted(nd.name for nd in await sched.list_nodes() if nd.drain_flag)
    out = analyse(rows, ids, placed, node_fault, fault_at, trusted)
    out["history"] = await check_histories(bs, out.pop("_history_pick"))
    out["exactly_once"] = exactly_once(rows, ids, jobs)
    if variant == "trust":
        out["trust"] = trust_report(rows, placed, failing[3], drained)
    running_again = sum(
        1 for j in jobs.values() if j.state is JobState.RUNNING and j.restart_count >= 1
    )
    return {
        "variant": variant,
        "workers": bs.workers,
        "jobs": n,
        "submit_s": submit_s,
        "killed_processes": killed,
        "kill_spread_s": (max(node_fault.values()) - fault_at).total_seconds(),
        "stall_s": stall["stall_s"],
        "busy_after_fault": stall["busy"],
        "running_again": running_again,
        "handled_s": handled_s,
        "settled_s": settled_s,
        "drained": drained,
        "false_drains": [d for d in drained if d not in trusted],
        "expected_drained": list(trusted),
        "worker": cpu_worker,
        "watcher": cpu_watcher,
        "temporal": cpu_temporal,
        "kill": kill,
        **out,
    }


FINAL = {s.value for s in TERMINAL_STAGES}


def check_alive(bs: BenchStack) -> None:
    """Fail the burst at once when the stack's worker or watcher has exited (a burst without
    them would wait out its deadline for nothing)."""
    for name, proc in bs.procs.items():
        code = proc.poll()
        if code is not None:
            raise BenchError(
                f"relaunch {name} (pid {proc.pid}) exited with {code} "
                f"(see {bs.root / f'{bs.name}-{name}.log'})"
            )


def job_of(incident_id: str) -> str:
    """The job id of a job recovery's incident (``relaunch-<cluster>-<job>-<attempt>``); "" for
    a node decision's."""
    if parse_node_decision_id(incident_id) is not None:
        return ""
    parts = incident_id.rsplit("-", 2)
    return parts[-2] if len(parts) == 3 else ""


def last_stages(stages: list[Any]) -> dict[str, str]:
    final: dict[str, str] = {}
    for e in sorted(stages, key=lambda e: e.id):
        final[e.incident_id] = str(e.stage)
    return final


async def kill_worker(
    bs: BenchStack, audit: AuditStore, after: float, fault_at: datetime
) -> dict[str, Any]:
    """SIGKILL the worker ``after`` s after the fault: with one process, that process (started
    again at once, as a process manager would); with several, one child of the supervisor
    (which restarts it)."""
    await asyncio.sleep(max(0.0, after - (now() - fault_at).total_seconds()))
    done = sum(
        1
        for e in await all_events(audit, ["action"])
        if e.data.get("step") == "restart" and e.data.get("changed")
    )
    parent = bs.procs["worker"]
    if bs.workers > 1:
        children = psutil.Process(parent.pid).children()
        if not children:
            raise BenchError("the worker supervisor has no child to kill")
        victim = children[0].pid
        os.kill(victim, signal.SIGKILL)
        at = now()
        how = f"one of {len(children)} worker processes (the supervisor restarts it)"
    else:
        victim = parent.pid
        parent.kill()
        at = now()
        await asyncio.to_thread(parent.wait)
        bs.start_proc("worker")
        how = "the worker process, started again at once"
    log(f"scale: SIGKILLed {how}, pid {victim}; {done} jobs requeued before")
    return {
        "after_fault_s": (at - fault_at).total_seconds(),
        "pid": victim,
        "how": how,
        "requeued_before": done,
    }


def analyse(
    rows: list[Any],
    ids: list[str],
    placed: dict[str, str],
    node_fault: dict[str, datetime],
    fault_at: datetime,
    trusted: list[str],
) -> dict[str, Any]:
    """Every figure of the burst that the audit trail gives (see the module's docstring)."""
    id_set = set(ids)
    by: dict[str, dict[str, list[Any]]] = {}
    for e in sorted(rows, key=lambda e: e.id):
        by.setdefault(e.incident_id, {}).setdefault(e.kind, []).append(e)
    job_incidents = {i: k for i, k in by.items() if job_of(i) in id_set}
    decisions = {i: k for i, k in by.items() if parse_node_decision_id(i) is not None}

    first_det: dict[str, datetime] = {}
    for i, k in job_incidents.items():
        for e in k.get("detection", []):
            at = datetime.fromisoformat(str(e.data["detected_at"]))
            first_det[i] = min(first_det.get(i, at), at)
    det_s = [(t - node_fault[placed[job_of(i)]]).total_seconds() for i, t in first_det.items()]

    def restarts(k: dict[str, list[Any]]) -> list[Any]:
        return [e for e in k.get("action", []) if e.data.get("step") == "restart"]

    def drains(k: dict[str, list[Any]]) -> list[Any]:
        return [e for e in k.get("action", []) if e.data.get("step") == "drain"]

    decision_drain = {d: min((e.at for e in drains(k)), default=None) for d, k in decisions.items()}
    joined: dict[str, dict[str, str]] = {}
    requeue_by: dict[str, str] = {}
    for i, k in job_incidents.items():
        for e in k.get("node_decision", []):
            if e.data.get("decisions"):
                joined[i] = dict(e.data["decisions"])
                requeue_by[i] = str(e.data.get("requeue_by", ""))

    # The earlier figures: an incident's first own action row, its first restart row.
    act_s, rst_s = [], []
    # This change's: first action = its own first action or the drain of a decision it joined
    # (0 when that drain came before the job's detection); requeue = its restart row that
    # changed the job.
    first_action_s, requeue_s = [], []
    pre_isolated = 0
    for i, det in first_det.items():
        k = job_incidents[i]
        own = [e.at for e in k.get("action", [])]
        if own:
            act_s.append((min(own) - det).total_seconds())
        if r := restarts(k):
            rst_s.append((min(e.at for e in r) - det).total_seconds())
        if changed := [e.at for e in restarts(k) if e.data.get("changed")]:
            requeue_s.append((min(changed) - det).total_seconds())
        via = [t for d in joined.get(i, {}).values() if (t := decision_drain.get(d)) is not None]
        cand = own + via
        if cand:
            first = min(cand)
            if first < det:
                pre_isolated += 1
            first_action_s.append(max(0.0, (first - det).total_seconds()))

    final = {i: str(k["stage"][-1].stage) for i, k in by.items() if k.get("stage")}

    # Drains, across every incident: how many changed each node (exactly once is right).
    drain_count: dict[str, int] = {}
    for k in by.values():
        for e in drains(k):
            if e.data.get("changed"):
                for node in e.nodes or [str(e.data.get("target", "?"))]:
                    drain_count[node] = drain_count.get(node, 0) + 1

    node_rows = []
    for d, k in sorted(decisions.items()):
        parsed = parse_node_decision_id(d)
        assert parsed is not None
        node = parsed[1]
        drain_at = decision_drain.get(d)
        on_node = [t for i, t in first_det.items() if placed.get(job_of(i)) == node]
        batches = [
            {
                "batch": e.data.get("batch"),
                "size": len(e.data.get("jobs") or []),
                "requeued": sum(
                    1 for o in (e.data.get("outcomes") or {}).values() if o == "requeued"
                ),
                "took_s": e.data.get("took_s"),
                "at_s": (e.at - fault_at).total_seconds(),
                "ahead": e.data.get("ahead") is True,
            }
            for e in k.get("requeue_batch", [])
        ]
        node_rows.append(
            {
                "id": d,
                "node": node,
                "joined": sum(1 for j in joined.values() if d in j.values()),
                "requeues": sum(1 for r in requeue_by.values() if r == d),
                "fault_to_drain_s": (drain_at - node_fault[node]).total_seconds()
                if drain_at and node in node_fault
                else None,
                "detection_to_drain_s": (drain_at - min(on_node)).total_seconds()
                if drain_at and on_node
                else None,
                "batches": batches,
                "final_stage": final.get(d, "?"),
            }
        )

    # The audit trail of every job incident.
    missing: dict[str, list[str]] = {}
    paths = {"node_decision": 0, "own_plan": 0}
    for i, k in job_incidents.items():
        lack = [kind for kind in ("detection", "evidence", "verdict") if not k.get(kind)]
        if i in joined:
            paths["node_decision"] += 1
        elif k.get("plan"):
            paths["own_plan"] += 1
        else:
            lack.append("node_decision or plan")
        if not restarts(k):
            lack.append("restart action")
        if final.get(i) not in {"done", "verifying"}:
            lack.append(f"final stage {final.get(i, 'none')}")
        if lack:
            missing[i] = lack
    no_incident = sorted(id_set - {job_of(i) for i in job_incidents})
    reasons: dict[str, int] = {}
    for lack in missing.values():
        for what in lack:
            key = "final stage not done/verifying" if what.startswith("final stage") else what
            reasons[key] = reasons.get(key, 0) + 1
    audit = {
        "incidents": len(job_incidents),
        "complete": len(job_incidents) - len(missing),
        "incomplete": len(missing),
        "missing": reasons,
        "examples": [f"{i}: {', '.join(m)}" for i, m in sorted(missing.items())[:5]],
        "no_incident": len(no_incident),
        "no_incident_examples": no_incident[:5],
        "paths": paths,
    }
    pick = sorted(i for i in joined if requeue_by.get(i))
    pick = random.Random(len(ids)).sample(pick, min(HISTORY_SAMPLE, len(pick)))

    # Where the time goes: each milestone's first row, from the incident's first detection.
    milestones: dict[str, dict[str, datetime]] = {}
    for i, k in job_incidents.items():
        for kind, events in k.items():
            if kind in {"detection", "requeue_batch"}:
                continue
            for e in events:
                key = f"stage:{e.stage}" if kind == "stage" else kind
                seen = milestones.setdefault(key, {})
                seen[i] = min(seen.get(i, e.at), e.at)
    breakdown = {}
    for key, when in sorted(milestones.items()):
        spans = [(t - first_det[i]).total_seconds() for i, t in when.items() if i in first_det]
        breakdown[key] = {"n": len(spans), "p50": pct(spans, 50), "p95": pct(spans, 95)}

    job_final = [st for i, st in final.items() if i in job_incidents]
    return {
        "incidents": len(first_det),
        "restarted": sum(1 for k in job_incidents.values() if restarts(k)),
        "requeued": len(requeue_s),
        "detect_p50": pct(det_s, 50),
        "detect_p95": pct(det_s, 95),
        "action_p50": pct(act_s, 50),
        "action_p95": pct(act_s, 95),
        "restart_p50": pct(rst_s, 50),
        "restart_p95": pct(rst_s, 95),
        "restart_max": max(rst_s, default=float("nan")),
        "first_action_p50": pct(first_action_s, 50),
        "first_action_p95": pct(first_action_s, 95),
        "first_action_max": max(first_action_s, default=float("nan")),
        "pre_isolated": pre_isolated,
        "requeue_p50": pct(requeue_s, 50),
        "requeue_p95": pct(requeue_s, 95),
        "requeue_max": max(requeue_s, default=float("nan")),
        "stages": {st: job_final.count(st) for st in sorted(set(job_final))},
        "since_detection": breakdown,
        "node_decisions": node_rows,
        "drain_count": drain_count,
        "drained_once": all(drain_count.get(node) == 1 for node in trusted)
        and all(node in trusted for node in drain_count),
        "audit": audit,
        "det_samples": det_s,
        "act_samples": act_s,
        "first_action_samples": first_action_s,
        "requeue_samples": requeue_s,
        "_history_pick": [(i, requeue_by[i]) for i in pick],
    }


async def check_histories(bs: BenchStack, pick: list[tuple[str, str]]) -> dict[str, Any]:
    """Whether each picked job workflow's Temporal history holds the id of the node decision
    that requeues its job (in the join's result or a `node_update` signal): the payloads are
    plain JSON inside the serialized events (no codec)."""
    client = await Client.connect(bs.s.temporal_address)
    found, missing = 0, []
    for wid, decision in pick:
        try:
            history = await client.get_workflow_handle(wid).fetch_history()
        except Exception as exc:  # a history that cannot be read is reported, not fatal
            missing.append(f"{wid}: {exc}"[:200])
            continue
        where = [
            e.WhichOneof("attributes") or "?"
            for e in history.events
            if decision.encode() in e.SerializeToString()
        ]
        if where:
            found += 1
        else:
            missing.append(wid)
    return {"checked": len(pick), "with_decision": found, "missing": missing[:5]}


def exactly_once(rows: list[Any], ids: list[str], jobs: dict[str, Any]) -> dict[str, Any]:
    """Each burst job: Slurm's restart count now and the restart rows that changed it."""
    changed: dict[str, int] = {}
    for e in rows:
        if e.kind == "action" and e.data.get("step") == "restart" and e.data.get("changed"):
            job = job_of(e.incident_id)
            changed[job] = changed.get(job, 0) + 1
    bad = []
    for job in ids:
        count = jobs[job].restart_count if job in jobs else None
        if count != 1 or changed.get(job, 0) != 1:
            bad.append({"job": job, "restart_count": count, "rows": changed.get(job, 0)})
    return {"jobs": len(ids), "ok": len(ids) - len(bad), "bad_n": len(bad), "bad": bad[:10]}


def trust_report(
    rows: list[Any], placed: dict[str, str], node: str, drained: list[str]
) -> dict[str, Any]:
    """What became of the jobs whose node was named by their own output only."""
    mine = {j for j, nd in placed.items() if nd == node}
    final: dict[str, str] = {}
    plans: dict[str, int] = {}
    verdicts: dict[str, int] = {}
    examples: dict[str, str] = {}
    joined = 0
    for e in sorted(rows, key=lambda e: e.id):
        if job_of(e.incident_id) not in mine:
            continue
        if e.kind == "stage":
            final[e.incident_id] = str(e.stage)
        elif e.kind == "plan":
            d = e.data
            key = (
                f"{d.get('action')} drain={','.join(d.get('drain_nodes') or []) or '-'} "
                f"exclude={','.join(d.get('exclude_nodes') or []) or '-'} "
                f"suspect={','.join(d.get('suspect_nodes') or []) or '-'}"
            )
            plans[key] = plans.get(key, 0) + 1
            examples.setdefault("plan", e.summary[:300])
        elif e.kind == "verdict":
            d = e.data
            key = (
                f"{d.get('category')} culprits={','.join(d.get('culprit_nodes') or []) or '-'} "
                f"suspects={d.get('suspects') or '-'}"
            )
            verdicts[key] = verdicts.get(key, 0) + 1
            examples.setdefault("verdict", e.summary[:300])
        elif e.kind == "node_decision" and e.data.get("decisions"):
            joined += 1
    stages = list(final.values())
    decisions = sorted(
        {
            e.incident_id
            for e in rows
            if (p := parse_node_decision_id(e.incident_id)) and p[1] == node
        }
    )
    return {
        "node": node,
        "jobs": len(mine),
        "incidents": len(final),
        "stages": {st: stages.count(st) for st in sorted(set(stages))},
        "verdicts": verdicts,
        "plans": plans,
        "examples": examples,
        "joined_a_decision": joined,
        "node_decisions": decisions,
        "drained": node in drained,
    }


async def submit_held(bs: BenchStack, n: int) -> float:
    """``n`` held, opted-in jobs in the queue (before the burst, so that its faults are
    detected and acted on with the queue that large); the seconds it took."""
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
    return time.monotonic() - t0


CURVE_SIZES = (1_000, 10_000, 50_000)
COST_WINDOW_S = 60.0


async def cost_curve(bs: BenchStack, held: int) -> list[dict[str, Any]]:
    """The queue grown to each size of CURVE_SIZES up to ``held`` (and ``held`` itself), the
    watcher's cost at each: what grows with the queue (the listings), nothing running yet."""
    sizes = sorted({n for n in CURVE_SIZES if n < held} | {held})
    have, curve = 0, []
    for size in sizes:
        submit_s = await submit_held(bs, size - have)
        have = size
        point = await watcher_cost(bs, size, 3, submit_s)
        log(f"cost at {size} held jobs: {json.dumps(point)}")
        curve.append(point)
    return curve


async def watcher_cost(
    bs: BenchStack, n: int, polls: int, submit_s: float, quiet_at: float | None = None
) -> dict[str, Any]:
    """With ``n`` held, opted-in jobs in the queue: time Watcher.poll_once and its two reads,
    and the real watcher process's CPU and slurmctld's RPCs while it watches. With
    ``quiet_at`` (monotonic: the burst's end plus the watcher's busy time), the window starts
    no sooner: what the watcher costs while nothing happens, not while it follows recoveries."""
    sched = bs.sched()
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
    waited = max(0.0, (quiet_at or 0.0) - time.monotonic())
    if waited:
        log(f"scale: waiting {waited:.0f}s for the watcher to be quiet (busy_s after the burst)")
        await asyncio.sleep(waited)
    rpcs_before, began = sdiag_rpcs(bs), time.monotonic()
    real.start()
    # Long enough for a few of the watcher's job listings (every 14 s at 10,000 jobs, at least
    # every 30 s: relaunch/workers/watch_cadence.py), so the mean is not one listing's luck.
    await asyncio.sleep(COST_WINDOW_S)
    real_cpu = await real.stop()
    window_s = time.monotonic() - began
    rpcs = rpc_rates(rpcs_before, sdiag_rpcs(bs), window_s)
    log(f"scale: slurmctld served {rpcs['total']:.2f} RPC/s with the watcher: {rpcs['by_type']}")
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
        # slurmctld's RPCs per second in the same window (`sdiag`, before and after): the
        # watcher's listings, the stack's other processes (idle) and the nodes' registrations.
        "slurmctld_rpcs_per_s": rpcs["total"],
        "slurmctld_rpcs_by_type": rpcs["by_type"],
        "window_s": window_s,
        "quiet_wait_s": waited,
        "polls": polls,
    }


def sdiag_rpcs(bs: BenchStack) -> dict[str, int]:
    """slurmctld's RPC counts by message type since it started (`sdiag`)."""
    out = subprocess.run(
        ["sdiag"],
        env={**os.environ, **bs.s.slurm_env},
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    ).stdout
    return parse_sdiag_rpcs(out)


_RPC_LINE = re.compile(
    r"^\s+([A-Z_0-9]+)\s+\(\s*\d+\)\s+count:(\d+)\s+ave_time:(\d+)\s+total_time:(\d+)"
)


def parse_sdiag(text: str) -> dict[str, tuple[int, int]]:
    """sdiag's "Remote Procedure Call statistics by message type": per type, (count,
    total_time in microseconds)."""
    out: dict[str, tuple[int, int]] = {}
    section = False
    for line in text.splitlines():
        if line.startswith("Remote Procedure Call statistics"):
            section = "by message type" in line
            continue
        found = _RPC_LINE.match(line) if section else None
        if found:
            out[found.group(1)] = (int(found.group(2)), int(found.group(4)))
    return out


def parse_sdiag_rpcs(text: str) -> dict[str, int]:
    """The counts of sdiag's "Remote Procedure Call statistics by message type" section."""
    return {kind: count for kind, (count, _) in parse_sdiag(text).items()}


def rpc_rates(before: dict[str, int], after: dict[str, int], window_s: float) -> dict[str, Any]:
    """RPCs per second over the window: in total and by message type (those that moved)."""
    moved = {k: v - before.get(k, 0) for k, v in after.items() if v - before.get(k, 0) > 0}
    span = max(window_s, 1e-9)
    return {
        "total": round(sum(moved.values()) / span, 3),
        "by_type": {k: round(v / span, 3) for k, v in sorted(moved.items())},
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
