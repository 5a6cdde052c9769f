"""A model of the rack-failure burst for the watcher alone: do all jobs of the failed nodes get a
detection when their nodes' decisions requeue them ahead?

The watcher's real loop (relaunch/workers/watcher.py) against an in-memory scheduler: 4 nodes
of N running jobs each (and HELD queued jobs, listed at ~60 us a job as squeue does), an Xid 79
line in each node's kernel log, each node report answered by requeuing that node's reported jobs
after DELAY seconds. Prints how many of the jobs got a detection (docs/scale.md).

Usage: python bench/watch_burst_model.py [N=125] [HELD=0] [DELAY=1.0]
"""

from __future__ import annotations

import asyncio
import os
import shutil
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from relaunch.models.scheduler import Job, JobState, Node, NodeState  # noqa: E402
from relaunch.workers.watcher import WatchConfig, Watcher  # noqa: E402

XID = (
    "{t} {n} kernel: [1.0] NVRM: Xid (PCI:0000:3b:00): 79, pid=4242, name=python3, "
    "GPU has fallen off the bus.\n"
)
NODES = ["n1", "n2", "n3", "n4"]
FIRST = 50001


class Scheduler:
    """What the watcher reads: every job, the active ones, the nodes."""

    def __init__(self, root: Path, per_node: int, held: int) -> None:
        self.held = held
        self.jobs: dict[str, Job] = {}
        job_id = FIRST
        for node in NODES:
            for _ in range(per_node):
                log = root / f"{job_id}.out"
                log.write_text("")
                self.jobs[str(job_id)] = Job(
                    job_id=str(job_id),
                    user_id=os.getuid(),
                    group_id=os.getgid(),
                    state=JobState.RUNNING,
                    partition="debug",
                    comment="relaunch=on",
                    nodes=[node],
                    num_tasks=1,
                    stdout_path=str(log),
                    stderr_path=str(log),
                )
                job_id += 1
        for _ in range(held):
            self.jobs[str(job_id)] = Job(
                job_id=str(job_id), state=JobState.PENDING, partition="debug", comment="relaunch=on"
            )
            job_id += 1

    async def list_jobs(self) -> list[Job]:
        await asyncio.sleep(self.held * 60e-6)  # squeue's own time at that queue size
        return list(self.jobs.values())

    async def list_active_jobs(self) -> list[Job]:
        return [j for j in self.jobs.values() if j.state is not JobState.PENDING]

    async def list_nodes(self) -> list[Node]:
        return [Node(name=n, state=NodeState.ALLOCATED) for n in NODES]

    def requeue(self, job_id: str) -> None:
        job = self.jobs[job_id]
        self.jobs[job_id] = job.model_copy(
            update={"state": JobState.PENDING, "restart_count": job.restart_count + 1, "nodes": []}
        )


async def main(per_node: int, held: int, delay: float) -> None:
    root = Path(tempfile.mkdtemp(prefix="relaunch-burst-model-"))
    try:
        sched = Scheduler(root, per_node, held)
        seen: dict[str, list[str]] = {}

        async def on_detection(det: Any) -> None:
            seen.setdefault(det.job_id, []).append(det.kind)

        async def on_report(report: Any) -> bool:
            async def requeue() -> None:
                await asyncio.sleep(delay)
                for job in report.running:
                    sched.requeue(job.job_id)

            tasks.add(asyncio.get_running_loop().create_task(requeue()))
            return True

        tasks: set[asyncio.Task[None]] = set()
        for node in NODES:
            (root / "nodes" / node).mkdir(parents=True)
            (root / "nodes" / node / "kern.log").write_text("")
        config = WatchConfig(cluster="model", node_log_pattern=str(root / "nodes/{node}/kern.log"))
        watcher = Watcher(config, sched, on_detection, on_node_report=on_report)
        stop = asyncio.Event()
        running = asyncio.create_task(watcher.run(stop))
        await asyncio.sleep(6)
        stamp = datetime.now(UTC).isoformat()
        for node in NODES:
            with open(root / "nodes" / node / "kern.log", "a") as f:
                f.write(XID.format(t=stamp, n=node))
            await asyncio.sleep(0.1)
        await asyncio.sleep(25)
        stop.set()
        await running
        burst = [str(FIRST + i) for i in range(len(NODES) * per_node)]
        missing = [j for j in burst if j not in seen]
        print(f"jobs {len(burst)}, detected {len(burst) - len(missing)}, missing {len(missing)}")
        if missing:
            print("missing:", ", ".join(missing[:20]))
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    args = sys.argv[1:]
    asyncio.run(
        main(
            int(args[0]) if args else 125,
            int(args[1]) if len(args) > 1 else 0,
            float(args[2]) if len(args) > 2 else 1.0,
        )
    )
