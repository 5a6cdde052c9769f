"""The three restart paths side by side (`bench/run.py --restart spare,requeue,resubmit`): the
same real faults against a job that trains again on a spare of its own allocation, one Relaunch
requeues, and one Relaunch cancels and submits again; where each path's seconds go, and what
that makes of a 16,384-GPU job's goodput at Llama 3's interruption rate (docs/spares.md).

Each path runs on a private stack of its own, one after the other (two cores: side by side they
would time each other's CPU). The spare path's job is examples/jobs/train_elastic.sbatch (three
nodes, two train under torchrun, `train_nodes=2`); the others' is the plain two-node DDP job."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
from datetime import datetime
from pathlib import Path
from typing import Any

import psutil
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter

from bench.faults import scenarios
from bench.faults.common import (
    BenchError,
    BenchStack,
    JobWatch,
    LogTail,
    log,
    now,
    pct,
    submit_ddp,
)
from relaunch.connectors.audit import AuditStore
from relaunch.devstack.workload import ELASTIC_SCRIPT, EXAMPLES
from relaunch.models.config import WatchSettings
from relaunch.models.errors import RelaunchError
from relaunch.models.recovery import Mode, Policy, RestartMethod, recovery_workflow_id

PATHS = ("spare", "requeue", "resubmit")
# The classes the spare path is for (a node is lost): the default of --restart.
CLASSES = ("gpu_hardware", "node_failure", "silent_node_crash")
STEP_START = re.compile(r"train-elastic: step \d+ on")
WORKER_UP = re.compile(r"worker up node=")
GROUP_READY = re.compile(r"process group ready rank=")
RESUMED = re.compile(r"resumed from checkpoint step=(\d+)")
STEP = re.compile(r"step=(\d+) loss=\S+ rank=\d+ node=(\S+)")
SUMMARY_KEYS = (
    "runs",
    "fault_to_running_p50",
    "fault_to_first_step_p50",
    "work_lost_steps_p50",
    "right_node_drained",
    "false_drains",
)
# Where a restart's seconds go, in order (each from the end of the one before).
PHASES = (
    ("detect_s", "detection"),
    ("decide_s", "decision"),
    ("act_s", "action (spare: the node out of the job, its step ended; requeue; cancel + submit)"),
    (
        "back_s",
        "back (spare: the job's script starts its step again; requeue and resubmit: Slurm "
        "schedules the job and starts its script)",
    ),
    (
        "launch_s",
        "process start (spare: the torchrun agents and their rendezvous, then the worker; "
        "else srun and the rank)",
    ),
    ("rendezvous_s", "rendezvous (the ranks' process group)"),
    ("restore_s", "checkpoint load"),
    ("step_s", "first training step"),
)


def path_stack(root: Path, path: str) -> BenchStack:
    """The stack a path runs on: Relaunch autonomous, requeue or resubmission as its restart,
    every node's launcher health file under the stack's directory."""
    policy = Policy(
        mode=Mode.AUTONOMOUS,
        restart_budget=100,
        verify_timeout_s=120,
        restart_method=RestartMethod.RESUBMIT if path == "resubmit" else RestartMethod.REQUEUE,
    )
    bs = BenchStack(
        root,
        f"rp{path[:3]}",
        {"cred_expire": 10},
        policy=policy,
        watch=WatchSettings(poll_interval_s=1.0),
    )
    return bs


def submit_elastic(bs: BenchStack, *, workdir: Path, ckpt_dir: Path, args: list[str]) -> str:
    env = {
        **os.environ,
        **bs.s.slurm_env,
        "RELAUNCH_PYTHON": sys.executable,
        "RELAUNCH_EXAMPLES": str(EXAMPLES),
        "CKPT_DIR": str(ckpt_dir),
    }
    out = subprocess.run(
        ["sbatch", "--parsable", f"--output={workdir}/train-%j.out",
         "--comment=relaunch=on,train_nodes=2", f"--chdir={workdir}", str(ELASTIC_SCRIPT), *args],
        env=env, capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip
    if out.returncode != 0:
        raise BenchError(f"sbatch of the elastic example failed: {out.stderr.strip()[-300:]}")
    return out.stdout.strip().split(";")[0]


class Tails:
    """A stamping tail of every train-*.out file in a directory (a resubmitted job writes a new
    one): started before the fault, so each line has the time it appeared."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.tails: dict[str, LogTail] = {}
        self._old: set[str] = set()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        # Earlier runs' files are never this run's: not read again every run.
        self._old = {p.name for p in self.workdir.glob("train-*.out")}
        self._task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        while True:
            for path in self.workdir.glob("train-*.out"):
                if path.name not in self.tails and path.name not in self._old:
                    tail = self.tails[path.name] = LogTail(path)
                    tail.start()
            await asyncio.sleep(0.1)

    def of(self, job_id: str) -> LogTail | None:
        return self.tails.get(f"train-{job_id}.out")

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        for tail in self.tails.values():
            await tail.stop()


def first_after(tail: LogTail, rx: re.Pattern[str], after: datetime) -> datetime | None:
    found = tail.first(rx, after)
    return found[0] if found else None


async def run_one(
    bs: BenchStack, client: Client, audit: AuditStore, path: str, cls: str, n: int, work: Path
) -> dict[str, Any]:
    """One fault of ``cls`` against a fresh job restarted by ``path``: its timeline."""
    sched = bs.sched()
    if path == "resubmit":
        # A resubmission runs the job's script again in the worker's environment, without the
        # arguments it was submitted with (sbatch takes the script on stdin): the checkpoint
        # directory comes from that environment ($CKPT_DIR, set in run_paths), one per stack,
        # emptied before each run.
        ckpt = Path(os.environ["CKPT_DIR"])
        shutil.rmtree(ckpt, ignore_errors=True)
        args = scenarios.train_args(cls)
    else:
        ckpt = work / f"ckpt-{path}-{cls}-{n}"
        args = [*scenarios.train_args(cls), "--ckpt-dir", str(ckpt)]
    tails = Tails(work)  # before the job exists: its file is new to this run
    tails.start()
    if path == "spare":
        job_id = await asyncio.to_thread(submit_elastic, bs, workdir=work, ckpt_dir=ckpt, args=args)
    else:
        job_id = await asyncio.to_thread(
            submit_ddp, bs, workdir=work, ckpt_dir=ckpt, args=args, port=22000 + n * 10
        )
    watch = JobWatch(sched, job_id)
    row: dict[str, Any] = {"path": path, "cls": cls, "run": n, "job": job_id}
    info: dict[str, Any] = {}
    try:
        await _until_tail(tails, job_id)
        tail = tails.of(job_id)
        assert tail is not None
        await tail.wait(
            lambda t: t.last_checkpoint() >= 10 and t.max_step() >= scenarios.FAULT_AFTER_STEP - 1,
            f"job {job_id} checkpoint and step {scenarios.FAULT_AFTER_STEP - 1}",
            180,
        )
        job = await sched.get_job(job_id)
        nodes = sorted(job.nodes)
        if path == "spare":  # a training node, not the batch host (it cannot leave its job)
            trains = {m.group(2) for _, line in tail.lines if (m := STEP.search(line))}
            culprit = sorted(trains - {job.nodes[0]})[0]
        else:
            culprit = nodes[1]
        before = job.restart_count
        watch.start()
        fault_at = now()
        info = await scenarios.INJECTORS[cls](bs, job_id, culprit, tail)
        fault_at = info.pop("struck_at", fault_at)
        row.update(culprit=culprit, job_nodes=nodes, fault_at=fault_at.isoformat())
        step_at_fault = tail.max_step(fault_at)
        incident = recovery_workflow_id(bs.cfg.name, job_id, before)
        status = await scenarios.workflow_result(client, incident, 240)
        row["stage"] = status.stage.value if status else "not started"
        row["action"] = status.verdict.action.value if status and status.verdict else "-"
        events = await audit.events(incident)
        new_job = next(
            (str(e.data["child"]) for e in events if e.kind == "lineage" and "child" in e.data),
            None,
        )
        row["new_job"] = new_job
        resumed_tail = tails.of(new_job) if new_job else tail
        if resumed_tail is None:
            raise BenchError(f"no output of job {new_job}, the resubmission of {job_id}")
        with contextlib.suppress(BenchError):
            await resumed_tail.wait(
                lambda t: t.resume(fault_at)[1] is not None, "first step after the resume", 150
            )
        drained = {x.name for x in await sched.list_nodes() if x.drain_flag}
        row["drained"] = sorted(drained)
        row["right_node_drained"] = culprit in drained
        row["false_drains"] = sorted(drained - {culprit})
        ckpt_step, first_step = resumed_tail.resume(fault_at)
        resumed_at = first_after(resumed_tail, RESUMED, fault_at)
        if ckpt_step is not None:
            row["work_lost"] = step_at_fault - ckpt_step
        running = _running_at(path, watch, resumed_tail, fault_at, before, resumed_at)
        marks = _marks(events, fault_at)
        launched = first_after(resumed_tail, WORKER_UP, running) if running else None
        ready = first_after(resumed_tail, GROUP_READY, launched) if launched else None
        row.update(_timeline(fault_at, marks, running, launched, ready, resumed_at, first_step))
        row["restart_count_after"] = (await sched.get_job(new_job or job_id)).restart_count
    except (BenchError, RelaunchError) as exc:
        row["error"] = str(exc)[:400]
        log(f"{path} {cls} run {n}: {exc}")
    finally:
        scenarios.undo_injection(info)
        await watch.stop()
        await tails.stop()
        _cont_all(bs, row.get("culprit"), job_id)
        for jid in {job_id, *(j for j in [row.get("new_job")] if j)}:
            with contextlib.suppress(RelaunchError):
                await sched.cancel_job(jid)
        await _cancel_all(bs)
        await bs.restore_nodes()
        await bs.wait_idle()
    log(
        f"{path} {cls} run {n}: job {job_id} → {row.get('stage')} {row.get('action')} "
        f"running {row.get('running_s', float('nan')):.1f}s first step "
        f"{row.get('first_step_s', float('nan')):.1f}s drained {row.get('drained')}"
    )
    return row


async def _until_tail(tails: Tails, job_id: str, timeout: float = 60) -> None:
    for _ in range(int(timeout * 10)):
        if tails.of(job_id) is not None:
            return
        await asyncio.sleep(0.1)
    raise BenchError(f"job {job_id} wrote no output in {timeout:.0f}s")


def _running_at(
    path: str,
    watch: JobWatch,
    tail: LogTail,
    fault_at: datetime,
    before: int,
    resumed_at: datetime | None,
) -> datetime | None:
    """When the job ran again: the spare path's step started again (the last start before the
    resume), else Slurm listing the job RUNNING again (a requeue: its restart count up; a
    resubmission: its child's first line)."""
    if path == "spare":
        starts = [t for t, line in tail.lines if t >= fault_at and STEP_START.search(line)]
        starts = [t for t in starts if resumed_at is None or t <= resumed_at]
        return starts[-1] if starts else None
    if path == "requeue":
        return watch.running_again(fault_at, before)
    return tail.lines[0][0] if tail.lines else None


def _marks(events: list[Any], fault_at: datetime) -> dict[str, datetime]:
    """Detection, decision and the first and last action of the recovery (its audit rows)."""
    out: dict[str, datetime] = {}
    detections = [
        datetime.fromisoformat(str(e.data["detected_at"]))
        for e in events
        if e.kind == "detection" and e.data.get("detected_at")
    ]
    if detections:
        out["detected"] = min(detections)
    decided = [e.at for e in events if e.kind in ("verdict", "plan")]
    if decided:
        out["decided"] = min(decided)
    acted = [
        e.at for e in events if e.kind == "action" and e.data.get("step") in ("restart", "cancel")
    ]
    if acted:
        out["acted"] = max(acted)
    return out


def _timeline(
    fault_at: datetime,
    marks: dict[str, datetime],
    running: datetime | None,
    launched: datetime | None,
    ready: datetime | None,
    resumed: datetime | None,
    first_step: datetime | None,
) -> dict[str, float]:
    points = [
        ("detect_s", marks.get("detected")),
        ("decide_s", marks.get("decided")),
        ("act_s", marks.get("acted")),
        ("back_s", running),
        ("launch_s", launched),
        ("rendezvous_s", ready),
        ("restore_s", resumed),
        ("step_s", first_step),
    ]
    out: dict[str, float] = {}
    last = fault_at
    for key, at in points:
        if at is None:
            continue
        out[key] = max(0.0, (at - last).total_seconds())
        last = max(last, at)
    if running is not None:
        out["running_s"] = (running - fault_at).total_seconds()
    if first_step is not None:
        out["first_step_s"] = (first_step - fault_at).total_seconds()
    return out


def _cont_all(bs: BenchStack, culprit: str | None, job_id: str) -> None:
    """SIGCONT the processes a freeze stopped (undo_injection kills them; belt and braces)."""
    if not culprit:
        return
    for proc in scenarios.rank_processes(bs, culprit, job_id):
        with contextlib.suppress(psutil.Error):
            proc.send_signal(signal.SIGCONT)


async def _cancel_all(bs: BenchStack) -> None:
    """Every job of the stack cancelled (a resubmission's child included)."""
    sched = bs.sched()
    with contextlib.suppress(RelaunchError):
        for job in await sched.list_jobs():
            if not job.state.is_terminal:
                with contextlib.suppress(RelaunchError):
                    await sched.cancel_job(job.job_id)


async def run_paths(
    root: Path, paths: list[str], classes: list[str], repeat: int
) -> list[dict[str, Any]]:
    """Every path's runs, path after path, each on its own stack."""
    rows: list[dict[str, Any]] = []
    for path in paths:
        bs = path_stack(root, path)
        work = root / f"work-{path}"
        work.mkdir(exist_ok=True)
        work.chmod(0o777)
        if path == "spare":  # the launchers' health files (docs/spares.md)
            bs.config_updates["launcher_health_pattern"] = str(root / "health" / "{node}")
        # A resubmission runs in the worker's environment: the interpreter with torch, and
        # where the example lives, as a site's module system would provide them.
        os.environ.setdefault("RELAUNCH_PYTHON", sys.executable)
        os.environ.setdefault("RELAUNCH_EXAMPLES", str(EXAMPLES))
        if path == "resubmit":
            os.environ["CKPT_DIR"] = str(work / "ckpt")
        try:
            await bs.up()
            client = await Client.connect(
                bs.s.temporal_address, data_converter=pydantic_data_converter
            )
            audit = await AuditStore.open(bs.s.database_url)
            try:
                n = 0
                for _ in range(repeat):
                    for cls in classes:
                        n += 1
                        rows.append(await run_one(bs, client, audit, path, cls, n, work))
            finally:
                await audit.close()
        finally:
            bs.down()
    return rows


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per class and path: the keys other tools read (SUMMARY_KEYS) and each phase's p50."""
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for r in rows:
        out.setdefault(r["cls"], {}).setdefault(r["path"], {"rows": []})["rows"].append(r)
    result: dict[str, Any] = {}
    for cls, by_path in out.items():
        result[cls] = {}
        for path, bucket in by_path.items():
            rs = bucket["rows"]
            ok = [r for r in rs if "error" not in r]
            entry = {
                "runs": len(rs),
                "fault_to_running_p50": _p50(ok, "running_s"),
                "fault_to_first_step_p50": _p50(ok, "first_step_s"),
                "work_lost_steps_p50": _p50(ok, "work_lost"),
                "right_node_drained": sum(1 for r in ok if r.get("right_node_drained")),
                "false_drains": sorted({n for r in ok for n in r.get("false_drains", [])}),
                "errors": [r["error"] for r in rs if "error" in r],
                "phases_p50": {key: _p50(ok, key) for key, _ in PHASES},
                "requeued": sum(1 for r in ok if r.get("restart_count_after", 0) > 0),
            }
            result[cls][path] = entry
    return result


def _p50(rows: list[dict[str, Any]], key: str) -> float | None:
    values = [float(r[key]) for r in rows if r.get(key) is not None]
    value = pct(values, 50)
    return None if value != value else round(value, 2)
