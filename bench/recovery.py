"""Recovery latency benchmark: the demo's failure (a node of a running DDP job dies and its GPU
prints Xid 79), measured end to end on a private local stack in autonomous mode.

For each run: fault → first detection recorded, detection → first action (drain), detection →
restart (requeue), and fault → job RUNNING again on healthy nodes. Writes
bench/results/recovery.md. Usage: python bench/recovery.py [--runs 5]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter

from relaunch.connectors.audit import AuditStore
from relaunch.devstack import faults
from relaunch.devstack.slurm import start_daemons
from relaunch.devstack.stack import Stack, StackConfig
from relaunch.devstack.workload import submit_training
from relaunch.models.config import ClusterConfig, WatchSettings
from relaunch.models.errors import RelaunchError
from relaunch.models.recovery import Mode, Policy, recovery_workflow_id
from relaunch.workflows.recovery import RecoveryWorkflow

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results" / "recovery.md"


async def one_run(
    stack: Stack,
    cfg: ClusterConfig,
    cfg_path: Path,
    work: Path,
    client: Client,
    audit: AuditStore,
    n: int,
) -> dict[str, float]:
    sched = stack.scheduler()
    job_id = submit_training(
        stack.slurm_env,
        workdir=work,
        ckpt_dir=work / f"ckpt{n}",
        args=["--step-sleep", "0.2", "--ckpt-every", "5"],
    )
    log = work / f"train-{job_id}.out"
    deadline = time.monotonic() + 120
    while "checkpoint saved" not in (log.read_text() if log.exists() else ""):
        if time.monotonic() > deadline:
            raise RelaunchError(f"job {job_id} wrote no checkpoint")
        await asyncio.sleep(0.3)
    job = await sched.get_job(job_id)
    culprit = job.nodes[-1]
    fault_at = datetime.now(UTC)
    faults.kill_node(
        stack.slurm,
        culprit,
        job_id=job_id,
        kernel_log=Path(cfg.node_log_pattern.format(node=culprit)),
    )  # type: ignore[union-attr]
    incident = recovery_workflow_id(cfg.name, job_id, job.restart_count)
    while True:
        try:
            result = await asyncio.wait_for(
                client.get_workflow_handle_for(RecoveryWorkflow.run, incident).result(), 300
            )
            break
        except TimeoutError:
            raise
        except Exception:
            await asyncio.sleep(0.5)
    history = await client.get_workflow_handle(incident).fetch_history()
    events = await audit.events(incident)
    detections = [e for e in events if e.kind == "detection"]
    drains = [e for e in events if e.kind == "action" and e.data.get("step") == "drain"]
    restarts = [e for e in events if e.kind == "action" and e.data.get("step") == "restart"]
    verify = [e for e in events if e.kind == "verify"]
    first_det = min(datetime.fromisoformat(str(d.data["detected_at"])) for d in detections)
    row = {
        "fault_to_detection": (first_det - fault_at).total_seconds(),
        "detection_to_drain": (drains[0].at - first_det).total_seconds(),
        "detection_to_restart": (restarts[0].at - first_det).total_seconds(),
        "fault_to_running": (verify[0].at - fault_at).total_seconds() if verify else float("nan"),
        "stage": 0.0 if result.stage.value == "done" else 1.0,
        "history_events": float(len(history.events)),
        "history_kb": len(history.to_json()) / 1024,
    }
    print(
        f"run {n}: job {job_id} culprit {culprit} → {result.stage.value}; "
        + ", ".join(f"{k}={v:.2f}" for k, v in row.items() if k != "stage"),
        flush=True,
    )
    await sched.cancel_job(job_id)
    start_daemons(stack.slurm)
    await asyncio.sleep(2)
    for _ in range(30):
        try:
            await sched.resume_node(culprit)
            break
        except RelaunchError:
            await asyncio.sleep(1)
    return row


async def bench(runs: int) -> None:
    root = Path(tempfile.mkdtemp(prefix="relaunch-bench-rec-"))
    root.chmod(0o755)
    stack = Stack(root / "state", StackConfig.with_free_ports(cluster="bench", services=False))
    procs: list[subprocess.Popen[bytes]] = []
    try:
        # Stack.up polls Slurm with its own event loop: run it off this one.
        await asyncio.to_thread(stack.up, lambda m: print(f"… {m}", flush=True))
        cfg = stack.cluster_config().model_copy(
            update={
                "policy": Policy(
                    mode=Mode.AUTONOMOUS,
                    drain_cap=100,
                    drain_share=1.0,
                    restart_budget=100,
                    verify_timeout_s=180,
                ),
                "watch": WatchSettings(poll_interval_s=1.0),
            }
        )
        cfg_path = root / "bench.json"
        cfg_path.write_text(cfg.model_dump_json())
        for nodedir in stack.slurm.nodes:
            Path(cfg.node_log_pattern.format(node=nodedir)).parent.mkdir(
                parents=True, exist_ok=True
            )  # type: ignore[union-attr]
        for name in ("worker", "watch"):
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-m", "relaunch.cli", name, "--config", str(cfg_path)],
                    stdout=open(root / f"{name}.log", "wb"),
                    stderr=subprocess.STDOUT,
                )
            )
        client = await Client.connect(
            stack.temporal_address, data_converter=pydantic_data_converter
        )
        audit = await AuditStore.open(stack.database_url)
        rows = [
            await one_run(stack, cfg, cfg_path, root, client, audit, n) for n in range(1, runs + 1)
        ]
        await audit.close()
        write_report(rows)
    finally:
        for p in procs:
            p.terminate()
        stack.down()
        shutil.rmtree(root, ignore_errors=True)


def write_report(rows: list[dict[str, float]]) -> None:
    keys = [
        "fault_to_detection",
        "detection_to_drain",
        "detection_to_restart",
        "fault_to_running",
        "history_events",
        "history_kb",
    ]
    lines = [
        "# Recovery latency (the demo's failure, autonomous mode)",
        "",
        f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC · {os.cpu_count()} cores · Python "
        f"{platform.python_version()} · {len(rows)} runs · poll interval 1.0 s · cred_expire 10 s",
        "",
        "Each run: the DDP example runs on 2 of 4 local Slurm nodes; one node's slurmd and the "
        "job's "
        "processes on it are killed with SIGKILL and its kernel-log source gets an Xid 79 line. "
        "Times are wall-clock from the audit trail (detection and action rows).",
        "",
        "| measure (s; history: events, KiB) | median | min | max |",
        "|---|---|---|---|",
    ]
    for k in keys:
        vals = [r[k] for r in rows if r[k] == r[k]]
        lines.append(
            f"| {k.replace('_', ' ')} | {statistics.median(vals):.2f} | {min(vals):.2f} | "
            f"{max(vals):.2f} |"
        )
    lines += ["", "Runs:", "", "| run | " + " | ".join(keys) + " |", "|---" * (len(keys) + 1) + "|"]
    for i, r in enumerate(rows, 1):
        lines.append(f"| {i} | " + " | ".join(f"{r[k]:.2f}" for k in keys) + " |")
    done = sum(1 for r in rows if r["stage"] == 0.0)
    lines += [
        "",
        f"{done} of {len(rows)} recoveries completed (stage done).",
        "fault to running again includes Slurm's requeue delay (cred_expire 10 s) and the "
        "scheduler; detection and action are the parts Relaunch controls.",
    ]
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=5, help="repetitions (default 5)")
    args = parser.parse_args()
    try:
        asyncio.run(bench(args.runs))
    except RelaunchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
