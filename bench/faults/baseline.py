"""The baseline: Slurm on its own, at its defaults (SlurmdTimeout=300 s, cred_expire=120 s),
no Relaunch worker or watcher. The same DDP job (`#SBATCH --requeue`) and the same real
injections; nothing drains the culprit. Measures fault → RUNNING again where Slurm recovers at
all, and records what Slurm did where it never does."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
from pathlib import Path
from typing import Any

import psutil

from bench.faults.common import BenchError, BenchStack, JobWatch, LogTail, log, now, submit_ddp
from bench.faults.scenarios import (
    CLASSES,
    EPOCH,
    FAULT_AFTER_STEP,
    INJECTORS,
    rank_processes,
    silence,
    train_args,
    undo_injection,
)
from relaunch.models.errors import RelaunchError

NEVER_REASON = {
    "node_failure": "the surviving rank's gloo sees its peer vanish and raises at once; srun "
    "--kill-on-bad-exit ends the step and the job ends FAILED long before slurmctld declares "
    "the node down (SlurmdTimeout), so Slurm's node-failure requeue never applies",
    "preemption": "not running again within the observation window",
    "gpu_hardware": "the rank died but slurmd lives: srun ends the step, the job ends FAILED and "
    "is not requeued (Slurm requeues only on node failure or preemption); Slurm never reads the "
    "kernel log, so the bad GPU's node stays in service",
    "network": "the cut rank raises, the job ends FAILED and is not requeued",
    "application": "the job ends FAILED; nothing restarts it (correct: a restart would fail again)",
    "hang": "the job stays RUNNING with no progress; Slurm ends it only at its time limit "
    "(INFINITE here; days on a real cluster)",
    "silent_hang": "the job stays RUNNING with no progress and no error line; the survivor's "
    "gloo gives up only after the job's 1800 s timeout, the job then ends FAILED and is not "
    "requeued; Slurm ends it otherwise only at its time limit",
    "silent_node_crash": "not running again within the observation window",
    "network_partition": "not running again within the observation window",
}
# Classes where Slurm itself requeues the job (node failure, preemption): watch long enough to
# see it (SlurmdTimeout=300 s, then the requeue with cred_expire=120 s).
SLURM_RECOVERS = {"node_failure": 900.0, "silent_node_crash": 900.0, "network_partition": 900.0}


async def run_baseline(
    bs: BenchStack, cls: str, n: int, work: Path, observe: float
) -> dict[str, Any]:
    sched = bs.sched()
    args = train_args(cls)
    job_id = await asyncio.to_thread(
        submit_ddp,
        bs,
        workdir=work,
        ckpt_dir=work / f"bckpt-{cls}-{n}",
        args=args,
        port=31000 + n * 10 + CLASSES.index(cls),
    )
    tail = LogTail(work / f"train-{job_id}.out")
    tail.start()
    watch = JobWatch(sched, job_id)
    row: dict[str, Any] = {"cls": cls, "run": n, "job": job_id, "baseline": True}
    urgent: str | None = None
    info: dict[str, Any] = {}
    try:
        await tail.wait(
            lambda t: t.last_checkpoint() >= 10 and t.max_step() >= FAULT_AFTER_STEP - 1,
            f"baseline job {job_id} checkpoint",
            180,
        )
        job = await sched.get_job(job_id)
        culprit = sorted(job.nodes)[1]
        before = job.restart_count
        watch.start()
        fault_at = now()
        info = await INJECTORS[cls](bs, job_id, culprit, tail)
        fault_at = info.pop("struck_at", fault_at)
        if cls == "application":
            found = tail.first("injected application error", EPOCH)
            fault_at = found[0] if found else fault_at
        urgent = info.get("urgent_job")
        row.update(culprit=culprit, fault_at=fault_at.isoformat())
        row.update({k: v for k, v in info.items() if k in ("slurmd_port", "dropped_ports")})
        step_at_fault = tail.max_step(fault_at)
        # Node failure and preemption: Slurm requeues by itself; wait for RUNNING again.
        limit = SLURM_RECOVERS.get(cls, 200.0 if cls == "preemption" else observe)
        deadline = time.monotonic() + limit
        ended_at: float | None = None
        while time.monotonic() < deadline:
            if watch.running_again(fault_at, before) and tail.resume(fault_at)[1] is not None:
                break
            # A job that ended FAILED (not REQUEUED/PENDING) stays ended: Slurm requeues only
            # on node failure or preemption, before the job ends. Watch 30 s more, then stop.
            last = watch.states[-1][1] if watch.states else ""
            if last in ("FAILED", "COMPLETED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY"):
                ended_at = ended_at or time.monotonic()
                if time.monotonic() - ended_at > 30:
                    limit = time.monotonic() - deadline + limit
                    break
            else:
                ended_at = None
            await asyncio.sleep(0.5)
        running = watch.running_again(fault_at, before)
        ckpt, first_step = tail.resume(fault_at)
        # A finished job leaves squeue after MinJobAge: fall back to the last state seen.
        row["final_state"] = watch.states[-1][1] if watch.states else "?"
        with contextlib.suppress(RelaunchError):
            row["final_state"] = (await sched.get_job(job_id)).state.value
        row["states"] = [s for _, s, _, _ in watch.states]
        drained = {node.name for node in await sched.list_nodes() if node.drain_flag}
        row["culprit_drained"] = culprit in drained
        if running:
            row["running_s"] = (running - fault_at).total_seconds()
            if first_step:
                row["first_step_s"] = (first_step - fault_at).total_seconds()
            if ckpt is not None:
                row["work_lost"] = step_at_fault - ckpt
            left = watch.left_running(fault_at)
            if left:
                row["noticed_s"] = (left - fault_at).total_seconds()
        else:
            row["never"] = NEVER_REASON.get(cls, f"not running again after {limit:.0f}s")
            row["observed_s"] = limit
            progress_after = tail.max_step() > step_at_fault
            row["progress_after"] = progress_after
        row["progress"] = [((t - fault_at).total_seconds(), s) for t, s in tail.progress()]
        row.update(silence(tail, fault_at))
    except (BenchError, RelaunchError) as exc:
        row["error"] = str(exc)[:400]
        log(f"baseline {cls} run {n}: {exc}")
    finally:
        undo_injection(info)
        await watch.stop()
        await tail.stop()
        if "culprit" in row:
            for proc in rank_processes(bs, row["culprit"], job_id):
                with contextlib.suppress(psutil.Error):
                    proc.send_signal(signal.SIGCONT)
        for j in (job_id, urgent):
            if j:
                with contextlib.suppress(RelaunchError):
                    await sched.cancel_job(j)
        await bs.restore_nodes(timeout=400)
        await bs.wait_idle()
    log(
        f"baseline {cls} run {n}: job {job_id} final {row.get('final_state')} running "
        f"{row.get('running_s', 'never')} states {row.get('states')}"
    )
    return row


async def run_baselines(
    bs: BenchStack, plan: list[str], work: Path, observe: float
) -> list[dict[str, Any]]:
    rows = []
    for n, cls in enumerate(plan, 1):
        rows.append(await run_baseline(bs, cls, n, work, observe))
    return rows
