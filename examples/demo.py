"""`make demo`: bring the local stack up, run a real 2-node job on the local Slurm, drain one of
its nodes, requeue the job excluding that node, and show it running again on healthy nodes.

The stack is left running for you to explore; the last lines say how to stop it.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

from relaunch.connectors.slurm.cli import SlurmCli
from relaunch.devstack.stack import Stack
from relaunch.models.errors import RelaunchError
from relaunch.models.scheduler import Job, JobState

ROOT = Path(__file__).resolve().parent.parent
STATE = ROOT / ".relaunch"
JOB_SCRIPT = ROOT / "examples" / "jobs" / "steps.sbatch"
DEMO_REASON = "relaunch demo"


class Timeline:
    def __init__(self) -> None:
        self.start = time.monotonic()
        self.rows: list[tuple[float, str]] = []

    def mark(self, text: str) -> None:
        elapsed = time.monotonic() - self.start
        self.rows.append((elapsed, text))
        print(f"[{datetime.now():%H:%M:%S}] +{elapsed:6.1f}s  {text}", flush=True)


async def wait_state(sched: SlurmCli, job_id: str, state: JobState, timeout: float) -> Job:
    deadline = time.monotonic() + timeout
    while True:
        job = await sched.get_job(job_id)
        if job.state is state:
            return job
        if time.monotonic() > deadline:
            raise RelaunchError(
                f"job {job_id} is {job.state.value} ({job.reason}), not {state.value}"
            )
        await asyncio.sleep(0.2)


async def wait_for_line(path: Path, needle: str, timeout: float = 30) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists():
            for line in reversed(path.read_text().splitlines()):
                if needle in line:
                    return line
        await asyncio.sleep(0.2)
    return "(no output yet)"


async def story(stack: Stack, tl: Timeline) -> None:
    sched = stack.scheduler()
    logs = STATE / "demo"
    logs.mkdir(parents=True, exist_ok=True)
    for old in await sched.list_jobs():  # a previous demo's job still holds two nodes
        if old.name == "steps" and old.state.is_active:
            await sched.cancel_job(old.job_id)
            tl.mark(f"cancelled job {old.job_id}, left running by an earlier demo")
    for node in await sched.list_nodes():  # a previous demo's drain
        if node.reason.startswith(DEMO_REASON):
            await sched.resume_node(node.name)
            tl.mark(f"resumed {node.name}, drained by an earlier demo")

    submitted = subprocess.run(
        [
            "sbatch",
            "--parsable",
            f"--output={logs}/steps-%j.out",
            "--comment=relaunch=on",
            str(JOB_SCRIPT),
        ],
        env={**os.environ, **stack.slurm_env},
        capture_output=True,
        text=True,
        check=True,
    )
    job_id = submitted.stdout.strip().split(";")[0]
    tl.mark(f"submitted job {job_id} (2 nodes, --requeue) from {JOB_SCRIPT.relative_to(ROOT)}")
    job = await wait_state(sched, job_id, JobState.RUNNING, 60)
    tl.mark(f"job {job_id} RUNNING on {', '.join(job.nodes)}")
    log = Path(job.stdout_path)
    culprit = job.nodes[-1]
    print(f"    log: {await wait_for_line(log, f'on {culprit}')}")

    drained = await sched.drain_node(culprit, f"{DEMO_REASON}: simulated GPU fault job {job_id}")
    tl.mark(f"drained {culprit}: {drained.before} -> {drained.after}")

    requeued = await sched.requeue_job(job_id, expected_restart_count=job.restart_count)
    tl.mark(f"requeued job {job_id}: {requeued.after}")
    excluded = await sched.exclude_nodes(job_id, [culprit])
    pending = await sched.get_job(job_id)
    eligible = f"{pending.eligible_time:%H:%M:%S}" if pending.eligible_time else "now"
    tl.mark(
        f"excluded {culprit} ({'done' if excluded.changed else excluded.note}); "
        f"eligible at {eligible} (cred_expire={stack.config.cred_expire}s)"
    )

    t0 = time.monotonic()
    restarted = await wait_state(sched, job_id, JobState.RUNNING, 180)
    tl.mark(
        f"job {job_id} RUNNING again on {', '.join(restarted.nodes)} "
        f"({time.monotonic() - t0:.1f}s after the requeue)"
    )
    if culprit in restarted.nodes:
        raise RelaunchError(f"job {job_id} restarted on the drained node {culprit}")
    print(f"    log: {await wait_for_line(log, f'(restart {restarted.restart_count})')}")

    node = await sched.get_node(culprit)
    print()
    print("Summary")
    print(
        f"  job {job_id}: {restarted.state.value} on {', '.join(restarted.nodes)}, "
        f"restarts={restarted.restart_count}, excluded={','.join(restarted.excluded_nodes)}"
    )
    print(f"  node {culprit}: {node.display_state}, reason {node.reason!r} (by {node.reason_user})")
    print(f"  job log: {log}")
    for elapsed, text in tl.rows:
        print(f"    +{elapsed:6.1f}s  {text}")


def main() -> int:
    stack = Stack(STATE)
    tl = Timeline()
    try:
        print(
            "Bringing up the local stack (Temporal, PostgreSQL, munge, 4-node Slurm)…", flush=True
        )
        status = stack.up(progress=lambda msg: print(f"  … {msg}", flush=True))
        tl.mark("stack up: " + ", ".join(p.name for p in status.parts if p.healthy))
        asyncio.run(story(stack, tl))
    except RelaunchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print()
    print("The stack is still running. To explore it from your shell:")
    print(f"  export SLURM_CONF={stack.slurm.conf}")
    print(f"  export TEMPORAL_ADDRESS={stack.temporal_address}")
    print("  sinfo -R; squeue")
    print(f"  Temporal UI: {stack.temporal_ui}")
    print("To stop it: .venv/bin/relaunch dev down   (or: make down)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
