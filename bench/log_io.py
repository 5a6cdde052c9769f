"""Log I/O: what the running watcher's log reading costs the filesystem at 2,000 tailed jobs.

Creates ``--jobs`` job log files and ``--nodes`` node kernel logs in a temporary directory and
runs the real :class:`relaunch.workers.watcher.Watcher` (its ``run`` loop: a poll every second,
a log pass every 0.25 s) against a fake scheduler that lists every job as RUNNING, opted in,
on one node each: the thing measured is file I/O, not Slurm. A writer process (its CPU is not
the watcher's) appends a training progress line every ``--step-s`` to ``--growing`` of the
logs; the rest stay quiet. ``--injections`` times, at a random moment, it appends an NCCL error
line (a root signature) to a quiet job's log.

Measured over ``--seconds`` after a warm-up, in the watcher's process:

- file operations per second made by the log reading (opens, stats, reads), counted by wrapping
  ``os`` in relaunch.connectors.logs / joboutput / operator_files (works on any version), and
  from ``relaunch_watch_file_ops_total`` where the version has it; ``syscr`` of
  /proc/self/io (read system calls of the whole process) alongside;
- the process's CPU share (``time.process_time`` over wall time);
- detection latency: the NCCL line appended → the detection handed to ``on_detection``.

Then, when strace is installed, a short window under ``strace -c -f`` cross-checks the counts
(openat / fstat-family / pread64 system calls against the wrapper's counts in that window;
strace slows the process, so it is not part of the rates).

``--before REF`` also runs the same measurement with the relaunch package of git ``REF`` (say,
the commit before logs were read by need), one after the other on this machine, and reports
both and their ratio. Writes bench/results/log_io.json and log_io.md.

Usage:
    python bench/log_io.py [--jobs 2000] [--nodes 500] [--growing 0.03] [--seconds 30]
                           [--injections 20] [--before REF]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.append(str(ROOT))

NCCL_LINE = (
    "gpu-017:393849:395082 [0] transport/net_ib/p2p.cc:1212 NCCL WARN NET/IB : Got completion "
    "from peer 10.42.0.2<47534> with error 12, opcode 0, len 0, vendor err 129\n"
)
NCCL_KIND = "signature:nccl_ib_completion_error"
KERN_LINE = "[  100.000000] NVRM: loading NVIDIA UNIX x86_64 Kernel Module\n"
MAX_JOBS, MAX_NODES, MAX_SECONDS = 20_000, 5_000, 600


# ------------------------------------------------------------------ the writer (a process)


def writer(spec: dict[str, Any]) -> None:
    """Append progress lines to the growing logs every step_s, and the NCCL lines at their
    times; print each injection as a JSON line (job, CLOCK_MONOTONIC time)."""
    growing = [Path(p) for p in spec["growing"]]
    injections = sorted((t, job, path) for t, job, path in spec["injections"])
    stop_at, step_s, step = spec["stop_at"], spec["step_s"], 0
    next_step = time.monotonic()
    while time.monotonic() < stop_at:
        now = time.monotonic()
        if now >= next_step:
            step += 1
            for path in growing:
                with path.open("a") as f:
                    f.write(f"0: step={step} loss=1.0 rank=0\n")
            next_step += step_s
        while injections and injections[0][0] <= now:
            _, job, path = injections.pop(0)
            with open(path, "a") as f:
                f.write(NCCL_LINE)
            print(json.dumps({"job": job, "t": time.monotonic()}), flush=True)
        due = min(next_step, injections[0][0]) if injections else next_step
        time.sleep(max(0.0, min(due - time.monotonic(), 0.05)))


# ------------------------------------------------------------------ one measurement


class CountingOs:
    """``os`` with its file operations counted (what the log reading calls)."""

    def __init__(self, counts: Counter[str]) -> None:
        self._counts = counts

    def __getattr__(self, name: str) -> Any:
        return getattr(os, name)

    def open(self, *args: Any, **kwargs: Any) -> int:
        self._counts["open"] += 1
        return os.open(*args, **kwargs)

    def fstat(self, fd: int) -> os.stat_result:
        self._counts["stat"] += 1
        return os.fstat(fd)

    def stat(self, *args: Any, **kwargs: Any) -> os.stat_result:
        self._counts["stat"] += 1
        return os.stat(*args, **kwargs)

    def pread(self, fd: int, n: int, offset: int) -> bytes:
        self._counts["read"] += 1
        return os.pread(fd, n, offset)


def syscr() -> int:
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("syscr:"):
            return int(line.split()[1])
    return 0


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def strace_counts(pid: int, seconds: float) -> dict[str, int] | None:
    """System calls of ``pid`` (all threads) over ``seconds``, by kind, from strace -c."""
    if shutil.which("strace") is None:
        return None
    with tempfile.NamedTemporaryFile(suffix=".strace") as out:
        calls = "openat,open,fstat,newfstatat,statx,stat,lstat,pread64,read"
        proc = subprocess.Popen(
            ["strace", "-c", "-f", "-e", f"trace={calls}", "-o", out.name, "-p", str(pid)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        time.sleep(seconds)
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            return None
        counts: dict[str, int] = {}
        for line in Path(out.name).read_text().splitlines():
            parts = line.split()
            if len(parts) >= 5 and parts[-1] not in ("syscall", "total") and parts[3].isdigit():
                counts[parts[-1]] = int(parts[3])
        return counts


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    import relaunch.connectors.joboutput as joboutput
    import relaunch.connectors.logs as logs
    import relaunch.connectors.operator_files as operator_files
    from relaunch.models.recovery import Detection
    from relaunch.models.scheduler import Job, JobState, Node, NodeState
    from relaunch.workers.watcher import WatchConfig, Watcher

    counts: Counter[str] = Counter()
    proxy = CountingOs(counts)
    for module in (logs, joboutput, operator_files):
        module.os = proxy  # type: ignore[attr-defined]

    rng = random.Random(args.seed)
    base = Path(tempfile.mkdtemp(prefix="log-io-"))
    try:
        jobs_dir = base / "jobs"
        jobs_dir.mkdir()
        node_names = [f"n{i:04d}" for i in range(args.nodes)]
        for node in node_names:
            (base / "nodes" / node).mkdir(parents=True)
            (base / "nodes" / node / "kern.log").write_text(KERN_LINE)
        jobs: list[Job] = []
        for i in range(args.jobs):
            path = jobs_dir / f"job-{i}.out"
            path.write_text("".join(f"0: step={s} loss=2.0 rank=0\n" for s in range(20)))
            jobs.append(
                Job(
                    job_id=str(1000 + i),
                    user_id=os.getuid(),
                    group_id=os.getgid(),
                    state=JobState.RUNNING,
                    partition="batch",
                    comment="relaunch=on",
                    nodes=[node_names[i % len(node_names)]] if node_names else [],
                    num_tasks=1,
                    stdout_path=str(path),
                    stderr_path=str(path),
                )
            )
        nodes = [Node(name=n, state=NodeState.ALLOCATED) for n in node_names]

        class Scheduler:
            async def list_jobs(self) -> list[Job]:
                return jobs

            async def list_nodes(self) -> list[Node]:
                return nodes

        detected: dict[str, float] = {}

        async def on_detection(det: Detection) -> None:
            if det.kind == NCCL_KIND:
                detected.setdefault(det.job_id, time.monotonic())

        settings: dict[str, Any] = {"cluster": "bench", "log_interval_s": 0.25}
        if node_names:
            settings["node_log_pattern"] = str(base / "nodes" / "{node}" / "kern.log")
        watcher = Watcher(WatchConfig.model_validate(settings), Scheduler(), on_detection)
        has_counter = hasattr(watcher.metrics, "file_ops")

        def counter() -> dict[str, float]:
            reg = watcher.metrics.registry
            return {
                op: reg.get_sample_value(
                    "relaunch_watch_file_ops_total", {"cluster": "bench", "op": op}
                )
                or 0.0
                for op in ("open", "stat", "read")
            }

        n_growing = round(args.jobs * args.growing)
        order = list(range(args.jobs))
        rng.shuffle(order)
        growing, quiet = order[:n_growing], order[n_growing:]
        start = time.monotonic() + args.warmup
        slot = args.seconds / max(args.injections, 1)
        injected_jobs = rng.sample(quiet, min(args.injections, len(quiet)))
        injections = [
            (start + (k + rng.uniform(0.1, 0.9)) * slot, jobs[i].job_id, jobs[i].stdout_path)
            for k, i in enumerate(injected_jobs)
        ]
        spec = {
            "growing": [jobs[i].stdout_path for i in growing],
            "injections": injections,
            "stop_at": start + args.seconds + 2,
            "step_s": args.step_s,
        }
        proc = subprocess.Popen(
            [sys.executable, __file__, "--writer", json.dumps(spec)],
            stdout=subprocess.PIPE,
            text=True,
        )
        stop = asyncio.Event()
        task = asyncio.create_task(watcher.run(stop))
        try:
            await asyncio.sleep(max(0.0, start - time.monotonic()))
            ops0, cnt0, io0 = Counter(counts), counter(), syscr()
            cpu0, t0 = time.process_time(), time.monotonic()
            await asyncio.sleep(args.seconds)
            ops1, cnt1, io1 = Counter(counts), counter(), syscr()
            cpu1, t1 = time.process_time(), time.monotonic()
            await asyncio.sleep(3.0)  # the last injection's detection
            strace: dict[str, Any] | None = None
            if args.strace_s > 0:
                before = Counter(counts)
                traced = await asyncio.to_thread(strace_counts, os.getpid(), args.strace_s)
                after = Counter(counts)
                if traced is not None:
                    strace = {
                        "seconds": args.strace_s,
                        "syscalls": traced,
                        "wrapper": {op: after[op] - before[op] for op in ("open", "stat", "read")},
                    }
            passes = watcher.stats.polls
        finally:
            stop.set()
            await asyncio.wait_for(task, timeout=30)
            proc.terminate()
            out, _ = proc.communicate(timeout=10)
        wall = t1 - t0
        latencies, missed = [], 0
        for line in out.splitlines():
            rec = json.loads(line)
            if rec["job"] in detected:
                latencies.append(detected[rec["job"]] - rec["t"])
            else:
                missed += 1
        ops = {op: (ops1[op] - ops0[op]) / wall for op in ("open", "stat", "read")}
        result: dict[str, Any] = {
            "relaunch": str(Path(logs.__file__).parent.parent),
            "jobs": args.jobs,
            "nodes": args.nodes,
            "growing": n_growing,
            "step_s": args.step_s,
            "seconds": round(wall, 2),
            "polls": passes,
            "file_ops_per_s": {k: round(v, 1) for k, v in ops.items()}
            | {"total": round(sum(ops.values()), 1)},
            "counter_ops_per_s": (
                {op: round((cnt1[op] - cnt0[op]) / wall, 1) for op in cnt1}
                | {"total": round(sum(cnt1[op] - cnt0[op] for op in cnt1) / wall, 1)}
                if has_counter
                else None
            ),
            "syscr_per_s": round((io1 - io0) / wall, 1),
            "cpu_pct": round(100 * (cpu1 - cpu0) / wall, 1),
            "detection": {
                "injected": len(latencies) + missed,
                "detected": len(latencies),
                "missed": missed,
                "p50_s": _round(percentile(latencies, 0.5)),
                "p95_s": _round(percentile(latencies, 0.95)),
                "max_s": _round(max(latencies) if latencies else None),
                "mean_s": _round(statistics.fmean(latencies) if latencies else None),
            },
            "strace": strace,
        }
        return result
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


# ------------------------------------------------------------------ the report


def run_child(args: argparse.Namespace, tree: Path | None) -> dict[str, Any]:
    """One measurement in a fresh process, with the relaunch package of ``tree``."""
    env = dict(os.environ) | {"PYTHONPATH": str(tree or ROOT)}
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        cmd = [sys.executable, __file__, "--one", out.name] + _passed(args)
        subprocess.run(cmd, env=env, check=True, cwd=tree or ROOT)
        return dict(json.loads(Path(out.name).read_text()))


def _passed(args: argparse.Namespace) -> list[str]:
    keys = ("jobs", "nodes", "growing", "seconds", "injections", "warmup", "step_s", "seed")
    out = []
    for key in keys:
        out += [f"--{key.replace('_', '-')}", str(getattr(args, key))]
    return out + ["--strace-s", str(args.strace_s)]


def git(*argv: str) -> str:
    done = subprocess.run(["git", *argv], cwd=ROOT, check=True, capture_output=True, text=True)
    return done.stdout


def report(data: dict[str, Any]) -> str:
    runs = data["runs"]
    labels = list(runs)
    first = runs[labels[-1]]
    lines = [
        "# Log I/O: the watcher's log reading at scale",
        "",
        f"`python bench/log_io.py {' '.join(data['argv'])}` on {data['started']} "
        f"({os.cpu_count()} cores, local disk): {first['jobs']} job logs ({first['growing']} "
        f"growing, a progress line every {first['step_s']} s; the rest quiet), "
        f"{first['nodes']} node kernel logs, the watcher's `run` loop (a poll every 1 s, a log "
        f"pass every 0.25 s) over {first['seconds']} s.",
        "",
        "| | " + " | ".join(f"{label} ({runs[label]['commit']})" for label in labels) + " |",
        "|---|" + "---|" * len(labels),
    ]

    def row(name: str, get: Any) -> None:
        lines.append(f"| {name} | " + " | ".join(str(get(runs[k])) for k in labels) + " |")

    row("file ops/s (open+stat+read)", lambda r: r["file_ops_per_s"]["total"])
    for op in ("open", "stat", "read"):
        row(f"… {op}/s", lambda r, op=op: r["file_ops_per_s"][op])
    row(
        "`relaunch_watch_file_ops_total`/s",
        lambda r: r["counter_ops_per_s"]["total"] if r["counter_ops_per_s"] else "—",
    )
    row("read syscalls/s (/proc/self/io syscr)", lambda r: r["syscr_per_s"])
    row("watcher CPU (% of a core)", lambda r: r["cpu_pct"])
    row(
        "detection p50 / p95 / max (s)",
        lambda r: (
            f"{r['detection']['p50_s']} / {r['detection']['p95_s']} / {r['detection']['max_s']}"
        ),
    )
    row(
        "injections detected",
        lambda r: f"{r['detection']['detected']}/{r['detection']['injected']}",
    )
    if len(labels) == 2:
        a, b = runs[labels[0]], runs[labels[1]]
        ratio = a["file_ops_per_s"]["total"] / max(b["file_ops_per_s"]["total"], 1e-9)
        cpu = a["cpu_pct"] / max(b["cpu_pct"], 1e-9)
        lines += ["", f"File operations: {ratio:.1f}× fewer; CPU: {cpu:.1f}× less."]
    lines += ["", "Cross-check under `strace -c -f` (a short window after the measurement):", ""]
    for label in labels:
        st = runs[label]["strace"]
        if not st:
            lines.append(f"- {label}: strace not available")
            continue
        sc = st["syscalls"]
        stats = sum(sc.get(k, 0) for k in ("fstat", "newfstatat", "statx", "stat", "lstat"))
        w = st["wrapper"]
        lines.append(
            f"- {label}: {st['seconds']} s: openat {sc.get('openat', 0)} (wrapper: "
            f"{w['open']}), fstat/newfstatat/statx {stats} (wrapper: {w['stat']}), pread64 "
            f"{sc.get('pread64', 0)} (wrapper: {w['read']})"
        )
    lines += [
        "",
        "Counted: the opens (a checked open is two: the O_PATH look and the read-only open), "
        "stats and preads the log reading makes, through a wrapper of `os` in the reading "
        "modules; strace sees also the process's other system calls (Python's own). "
        "Detection: an NCCL error line appended to a quiet job's log → the detection "
        "handed over.",
        "",
    ]
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        epilog="Writes bench/results/log_io.json and log_io.md (see the module docstring).",
    )
    p.add_argument("--jobs", type=int, default=2000, help="job log files (default 2000)")
    p.add_argument("--nodes", type=int, default=500, help="node kernel logs (default 500)")
    p.add_argument("--growing", type=float, default=0.03, help="share of logs that grow")
    p.add_argument("--step-s", type=float, default=0.5, help="a growing log's line interval")
    p.add_argument("--seconds", type=float, default=30.0, help="measured window (default 30)")
    p.add_argument("--warmup", type=float, default=8.0, help="seconds before measuring")
    p.add_argument("--injections", type=int, default=20, help="NCCL lines appended (20)")
    p.add_argument("--seed", type=int, default=32)
    p.add_argument("--strace-s", type=float, default=3.0, help="strace window (0: none)")
    p.add_argument("--before", metavar="REF", help="also measure the relaunch of git REF")
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    p.add_argument("--one", metavar="JSON", help=argparse.SUPPRESS)
    p.add_argument("--writer", metavar="SPEC", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if not 1 <= args.jobs <= MAX_JOBS:
        p.error(f"--jobs must be 1..{MAX_JOBS}")
    if not 0 <= args.nodes <= MAX_NODES:
        p.error(f"--nodes must be 0..{MAX_NODES}")
    if not 0 <= args.growing <= 1:
        p.error("--growing must be 0..1")
    if not 1 <= args.seconds <= MAX_SECONDS:
        p.error(f"--seconds must be 1..{MAX_SECONDS}")
    if not 0 < args.step_s <= 60 or not 0 <= args.injections <= 1000 or args.warmup < 0:
        p.error("--step-s must be 0..60, --injections 0..1000, --warmup >= 0")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.writer:
        writer(json.loads(args.writer))
        return 0
    if args.one:
        result = asyncio.run(measure(args))
        Path(args.one).write_text(json.dumps(result))
        return 0
    started = f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC"
    runs: dict[str, dict[str, Any]] = {}
    if args.before:
        try:
            commit = git("rev-parse", "--short", f"{args.before}^{{commit}}").strip()
        except subprocess.CalledProcessError:
            print(f"log_io: no such git commit: {args.before}", file=sys.stderr)
            return 2
        tree = Path(tempfile.mkdtemp(prefix="log-io-before-"))
        try:
            archive = subprocess.run(
                ["git", "archive", commit, "relaunch"], cwd=ROOT, check=True, capture_output=True
            )
            subprocess.run(["tar", "-x", "-C", str(tree)], input=archive.stdout, check=True)
            print(f"log_io: measuring {commit} (before) ...", flush=True)
            runs["before"] = run_child(args, tree) | {"commit": commit}
        finally:
            shutil.rmtree(tree, ignore_errors=True)
    head = git("rev-parse", "--short", "HEAD").strip()
    dirty = bool(git("status", "--porcelain", "relaunch").strip())
    print(f"log_io: measuring {head}{'+' if dirty else ''} (this tree) ...", flush=True)
    runs["after" if args.before else "this tree"] = run_child(args, None) | {
        "commit": head + ("+" if dirty else "")
    }
    data = {"started": started, "argv": sys.argv[1:] if argv is None else argv, "runs": runs}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "log_io.json").write_text(json.dumps(data, indent=2) + "\n")
    text = report(data)
    (args.out / "log_io.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
