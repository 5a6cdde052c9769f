"""Listing cost: each way the watcher could list jobs, measured with N held opted-in jobs in the
queue, on Slurm 22.05 and 24.11: what one listing costs the client and what it costs slurmctld.

Starts a private Slurm (munged, slurmctld, two ``slurmd -N``, slurmrestd; nothing of Relaunch)
under a temporary directory, for each release in turn, submits ``--sizes`` held opted-in jobs
(``sbatch --hold --comment=relaunch=on``) and 4 running ones, then measures each variant over
``--reps`` calls, one after another:

- wall p50 of one call;
- the client's CPU: the listing process's (``getrusage(RUSAGE_CHILDREN)`` deltas: squeue,
  sinfo, scontrol, curl, with the 24.11 wrappers' namespace set-up), and Relaunch's own parse
  where it has one (``RUSAGE_SELF``);
- the bytes of output;
- slurmctld's RPCs per call by message type and its time serving them (``sdiag``'s count and
  total_time before and after the calls), and slurmctld's CPU per call (its process, psutil),
  each less the idle background measured in a quiet window of the same length right after;
- for slurmrestd: its own CPU per call too.

Variants: a) ``SlurmCli.list_jobs_brief`` (the watcher today: squeue text, parsed); b)
``SlurmCli.list_jobs`` (squeue --json); c) squeue text with a narrow ``--states``; d) on 24.11,
``squeue --only-job-state`` (REQUEST_JOB_STATE), with and without ``--states``; e) slurmrestd's
``GET .../jobs`` in full and with ``update_time`` (Slurm's "no change since" answer); f) the node
listings (sinfo --json, scontrol show nodes --json); g) squeue text for named jobs (``-j``: one,
and the running ones; on 24.11 with ``--only-job-state`` too); and plain squeue invocations, to
see which ask slurmctld for the partitions too.

Also for slurmrestd: how often, polling once a second with the previous answer's
``last_update``, the answer is "no change" on a quiet queue, and with one job changed each
second.

Writes bench/results/listing_cost.json (merged by release: one release can be rerun alone) and
listing_cost.md. Every stack is taken down at the end, always. It starts Slurm daemons: on a
shared machine run it under the stack lock (``flock /tmp/relaunch-stack.lock ...``).

Usage:
    python bench/listing_cost.py [--releases 22.05,24.11] [--sizes 10000] [--reps 5]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.append(str(ROOT))

from bench.faults.common import BenchError, BenchStack, log, pct  # noqa: E402
from bench.faults.scale import parse_sdiag, submit_many  # noqa: E402
from relaunch.connectors.slurm import parse  # noqa: E402
from relaunch.devstack.slurm import ctld_pid  # noqa: E402
from relaunch.devstack.slurm_release import RELEASES  # noqa: E402

RESULTS = ROOT / "bench" / "results"
RUNNING_JOBS = 4  # on 2 nodes of 2 CPUs
# What the watcher needs of running jobs: those holding nodes (a narrow filter).
RUNNING_STATES = "RUNNING,COMPLETING,CONFIGURING,SUSPENDED,STAGE_OUT,SIGNALING,RESIZING"
# Every state but PENDING: the running ones and the ends of those it watched.
NOT_PENDING_STATES = (
    "RUNNING,SUSPENDED,COMPLETED,CANCELLED,FAILED,TIMEOUT,NODE_FAIL,PREEMPTED,BOOT_FAIL,"
    "DEADLINE,OUT_OF_MEMORY,COMPLETING,CONFIGURING,REQUEUED,REQUEUE_HOLD,SPECIAL_EXIT,"
    "STOPPED,SIGNALING,STAGE_OUT,RESIZING"
)
BRIEF = ["squeue", "--noheader", f"--Format={parse.BRIEF_FORMAT}"]
RESTD_VERSION = {"22.05": "v0.0.38", "24.11": "v0.0.42"}

# ------------------------------------------------------------------------------------ sdiag


def rpc_delta(
    before: dict[str, tuple[int, int]], after: dict[str, tuple[int, int]]
) -> dict[str, tuple[int, int]]:
    """What moved between two sdiag readings: per type, (calls, microseconds)."""
    out: dict[str, tuple[int, int]] = {}
    for kind, (count, usec) in after.items():
        c0, u0 = before.get(kind, (0, 0))
        if count - c0 > 0:
            out[kind] = (count - c0, usec - u0)
    return out


def per_call(
    busy: dict[str, tuple[int, int]], idle: dict[str, tuple[int, int]], calls: int
) -> tuple[dict[str, float], float]:
    """RPCs per call by type and slurmctld's serving time per call (ms), the idle window's
    background (same length) taken off; types left with nothing are dropped."""
    counts: dict[str, float] = {}
    usec = 0.0
    for kind in sorted(set(busy) | set(idle)):
        c = busy.get(kind, (0, 0))[0] - idle.get(kind, (0, 0))[0]
        u = busy.get(kind, (0, 0))[1] - idle.get(kind, (0, 0))[1]
        if c / calls >= 0.1:  # a single stray RPC over 5 calls is background noise
            counts[kind] = round(c / calls, 2)
        usec += max(u, 0)
    return counts, round(usec / calls / 1000, 2)


# ------------------------------------------------------------------------------ measuring


@dataclass
class Call:
    """One listing's own costs."""

    wall_s: float
    child_cpu_s: float
    self_cpu_s: float
    out_bytes: int
    records: int | None = None
    note: str = ""


@dataclass
class Variant:
    key: str
    what: str
    run: Callable[[], Awaitable[Call]]
    # For a SlurmCli read: the command it runs, run once more to count its output's bytes.
    bytes_argv: list[str] | None = None


def usage() -> tuple[float, float]:
    s = resource.getrusage(resource.RUSAGE_SELF)
    c = resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime, c.ru_utime + c.ru_stime


def tree_cpu(pid: int | None) -> float:
    """CPU seconds of a process and its live descendants (0 for none)."""
    if pid is None:
        return 0.0
    total = 0.0
    with contextlib.suppress(psutil.Error):
        root = psutil.Process(pid)
        for proc in [root, *root.children(recursive=True)]:
            with contextlib.suppress(psutil.Error):
                t = proc.cpu_times()
                total += t.user + t.system
    return total


class Lab:
    """One release's private cluster and the measurements made on it."""

    def __init__(self, bs: BenchStack, release: str, reps: int) -> None:
        self.bs = bs
        self.release = release
        self.reps = reps
        self.env = {**os.environ, **bs.s.slurm_env}
        self.sched = bs.sched()
        self.running: list[str] = []  # the running jobs' ids

    # ---------------------------------------------------------------- plumbing

    def sdiag(self) -> dict[str, tuple[int, int]]:
        out = subprocess.run(
            ["sdiag"], env=self.env, capture_output=True, text=True, timeout=60, check=True
        )
        return parse_sdiag(out.stdout)

    def ctld_cpu(self) -> float:
        return tree_cpu(ctld_pid(self.bs.s.slurm))

    def restd_pid(self) -> int | None:
        path = self.bs.s.slurm.root / "run" / "slurmrestd-local.pid"
        with contextlib.suppress(OSError, ValueError):
            return int(path.read_text().strip())
        return None

    async def exec(self, argv: list[str]) -> tuple[int, bytes, bytes]:
        proc = await asyncio.create_subprocess_exec(
            *argv, env=self.env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
        )
        out, err = await proc.communicate()
        return proc.returncode or 0, out, err

    def command(self, argv: list[str], *, lines: bool = True) -> Callable[[], Awaitable[Call]]:
        """A variant that runs ``argv`` and counts its output lines (or JSON ``jobs``)."""

        async def run() -> Call:
            s0, c0 = usage()
            w0 = time.perf_counter()
            rc, out, err = await self.exec(argv)
            wall = time.perf_counter() - w0
            s1, c1 = usage()
            if rc != 0:
                raise BenchError(f"{' '.join(argv)[:120]}: rc {rc}: {err.decode()[-300:]}")
            records = out.count(b"\n") if lines else None
            return Call(wall, c1 - c0, 0.0, len(out), records)

        return run

    def sliced(self, fn: Callable[[], Awaitable[list[Any]]]) -> Callable[[], Awaitable[Call]]:
        """A SlurmCli read (its command and its parse into Job records)."""

        async def run() -> Call:
            s0, c0 = usage()
            w0 = time.perf_counter()
            jobs = await fn()
            wall = time.perf_counter() - w0
            s1, c1 = usage()
            return Call(wall, c1 - c0, s1 - s0, -1, len(jobs))

        return run

    async def measure(self, v: Variant) -> dict[str, Any]:
        """``reps`` calls between two sdiag readings, then a quiet window as long."""
        await asyncio.sleep(1)
        r0, k0, d0, t0 = self.sdiag(), self.ctld_cpu(), tree_cpu(self.restd_pid()), time.monotonic()
        calls: list[Call] = []
        try:
            for _ in range(self.reps):
                calls.append(await v.run())
        except BenchError as exc:
            log(f"{self.release} {v.key}: {exc}")
            return {"what": v.what, "error": str(exc)[:400]}
        window = time.monotonic() - t0
        r1, k1, d1 = self.sdiag(), self.ctld_cpu(), tree_cpu(self.restd_pid())
        busy = rpc_delta(r0, r1)
        out_bytes = calls[-1].out_bytes
        if v.bytes_argv:
            out_bytes = len((await self.exec(v.bytes_argv))[1])
        # The quiet window: as long, nothing asked.
        q0, qk0, qd0 = self.sdiag(), self.ctld_cpu(), tree_cpu(self.restd_pid())
        await asyncio.sleep(window)
        q1, qk1, qd1 = self.sdiag(), self.ctld_cpu(), tree_cpu(self.restd_pid())
        idle = rpc_delta(q0, q1)
        rpcs, ctld_ms = per_call(busy, idle, len(calls))
        n = len(calls)
        result = {
            "what": v.what,
            "calls": n,
            "wall_ms_p50": round(pct([c.wall_s for c in calls], 50) * 1000, 1),
            "client_cpu_ms_p50": round(pct([c.child_cpu_s for c in calls], 50) * 1000, 1),
            "parse_cpu_ms_p50": round(pct([c.self_cpu_s for c in calls], 50) * 1000, 1),
            "out_bytes": out_bytes,
            "records": calls[-1].records,
            "rpcs_per_call": rpcs,
            "rpcs_per_call_total": round(sum(rpcs.values()), 2),
            "slurmctld_rpc_ms_per_call": ctld_ms,
            "slurmctld_cpu_ms_per_call": round(max((k1 - k0) - (qk1 - qk0), 0) / n * 1000, 1),
            "slurmrestd_cpu_ms_per_call": round(max((d1 - d0) - (qd1 - qd0), 0) / n * 1000, 1),
            "note": calls[-1].note,
        }
        log(
            f"{self.release} {v.key}: wall {result['wall_ms_p50']} ms, client CPU "
            f"{result['client_cpu_ms_p50']}+{result['parse_cpu_ms_p50']} ms, "
            f"{result['out_bytes']} B, {result['records']} records, RPCs {rpcs}, slurmctld "
            f"{ctld_ms} ms RPC time / {result['slurmctld_cpu_ms_per_call']} ms CPU"
        )
        return result

    # ---------------------------------------------------------------- slurmrestd

    def rest_url(self, query: str = "") -> str:
        return f"http://localhost/slurm/{RESTD_VERSION[self.release]}/jobs{query}"

    async def rest_get(self, query: str = "") -> tuple[dict[str, Any], int]:
        """slurmrestd's answer and its size in bytes. An empty body (22.05's answer to an
        unchanged ``update_time``) reads as ``{"http_status": code}``: no jobs."""
        argv = [
            "curl", "-sS", "--max-time", "60", "-w", "\n%{http_code}", "--unix-socket",
            str(self.bs.s.slurm.restd_socket), self.rest_url(query),
        ]  # fmt: skip
        rc, out, err = await self.exec(argv)
        if rc != 0:
            raise BenchError(f"curl: rc {rc}: {err.decode()[-300:]}")
        body, _, code = out.rpartition(b"\n")
        if not body.strip():
            return {"http_status": int(code or 0)}, 0
        try:
            return json.loads(body), len(body)
        except ValueError as exc:
            raise BenchError(f"slurmrestd answered no JSON ({code!r}): {body[:200]!r}") from exc

    def rest_variant(self, since: Callable[[], int | None]) -> Callable[[], Awaitable[Call]]:
        async def run() -> Call:
            t = since()
            s0, c0 = usage()
            w0 = time.perf_counter()
            data, size = await self.rest_get("" if t is None else f"?update_time={t}")
            wall = time.perf_counter() - w0
            s1, c1 = usage()
            jobs = data.get("jobs") or []
            errors = data.get("errors") or []
            note = "; ".join(str(e.get("error") or e.get("description") or e) for e in errors)
            if "http_status" in data:
                note = f"HTTP {data['http_status']}, empty body"
            return Call(wall, c1 - c0, 0.0, size, len(jobs), note[:200])

        return run

    async def last_update(self) -> int:
        """What a poller passes as ``update_time`` next: the answer's ``last_update``, or
        where the answer has none (v0.0.38), the time just before the request was sent."""
        asked = int(time.time())
        data, _ = await self.rest_get()
        return parse_last_update(data) or asked

    async def no_change_study(self, seconds: int, touch: str | None) -> dict[str, Any]:
        """Poll once a second with the previous answer's last_update; with ``touch``, change
        that job (its name) before each poll. How many answers were "no change"."""
        since = await self.last_update()
        answers: list[dict[str, Any]] = []
        for i in range(seconds):
            await asyncio.sleep(1)
            if touch:
                await self.exec(["scontrol", "update", f"JobId={touch}", f"Name=touched{i}"])
            asked = int(time.time())
            data, size = await self.rest_get(f"?update_time={since}")
            jobs = data.get("jobs") or []
            answers.append({"jobs": len(jobs), "bytes": size})
            since = parse_last_update(data) or asked
        unchanged = sum(1 for a in answers if a["jobs"] == 0)
        return {
            "polls": len(answers),
            "no_change_answers": unchanged,
            "jobs_per_answer": [a["jobs"] for a in answers],
            "bytes_p50": pct([float(a["bytes"]) for a in answers], 50),
        }


def parse_last_update(data: dict[str, Any]) -> int | None:
    """slurmrestd's ``last_update`` (v0.0.38: an int; v0.0.40+: {set, infinite, number})."""
    value = data.get("last_update")
    if isinstance(value, dict):
        value = value.get("number") if value.get("set") else None
    # v0.0.42's "no change" answer says 0: no time to pass on.
    return int(value) if isinstance(value, int) and value > 0 else None


# ------------------------------------------------------------------------------- one release


async def variants(lab: Lab, since: dict[str, int | None]) -> list[Variant]:
    sched = lab.sched
    newer = lab.release != "22.05"
    out = [
        Variant("0_floor", "squeue --version (no RPC: a command's start-up, 24.11's wrapper too)",
                lab.command(["squeue", "--version"])),
        Variant("a_brief", "SlurmCli.list_jobs_brief (today: squeue text --states=all, parsed)",
                lab.sliced(sched.list_jobs_brief),
                ["env", "SLURM_TIME_FORMAT=%s", *BRIEF, "--states=all"]),
        Variant("b_json", "SlurmCli.list_jobs (squeue --json --states=all, parsed)",
                lab.sliced(sched.list_jobs), ["squeue", "--json", "--states=all"]),
        Variant("c_running", f"squeue text --states={RUNNING_STATES}",
                lab.command([*BRIEF, f"--states={RUNNING_STATES}"])),
        Variant("c_not_pending", "squeue text --states=<every state but PENDING>",
                lab.command([*BRIEF, f"--states={NOT_PENDING_STATES}"])),
    ]  # fmt: skip
    watched = ",".join(lab.running)
    out += [
        Variant("g_one_job", "squeue text -j <one running job>",
                lab.command([*BRIEF, "--states=all", f"--jobs={lab.running[0]}"])),
        Variant("g_watched_jobs", f"squeue text -j <the {len(lab.running)} running jobs>",
                lab.command([*BRIEF, "--states=all", f"--jobs={watched}"])),
    ]  # fmt: skip
    if newer:
        out += [
            Variant("d_job_state_watched",
                    f"squeue --only-job-state -j <the {len(lab.running)} running jobs>",
                    lab.command(["squeue", "--only-job-state", "--noheader", "--states=all",
                                 f"--jobs={watched}"])),
            Variant("d_job_state", "squeue --only-job-state --states=all",
                    lab.command(["squeue", "--only-job-state", "--noheader", "--states=all"])),
            Variant("d_job_state_running", f"squeue --only-job-state --states={RUNNING_STATES}",
                    lab.command(["squeue", "--only-job-state", "--noheader",
                                 f"--states={RUNNING_STATES}"])),
        ]  # fmt: skip
    out += [
        Variant("e_rest_full", "slurmrestd GET jobs (no update_time)",
                lab.rest_variant(lambda: None)),
        Variant("e_rest_no_change", "slurmrestd GET jobs?update_time=<last answer's> (unchanged)",
                lab.rest_variant(lambda: since["t"])),
        Variant("f_sinfo_json", "sinfo --json", lab.command(["sinfo", "--json"], lines=False)),
    ]  # fmt: skip
    if newer:
        out.append(
            Variant("f_scontrol_nodes_json", "scontrol show nodes --json",
                    lab.command(["scontrol", "show", "nodes", "--json"], lines=False))
        )  # fmt: skip
    out += [
        Variant("p_plain", "squeue (plain)", lab.command(["squeue"])),
        Variant("p_states_all", "squeue --states=all", lab.command(["squeue", "--states=all"])),
        Variant("p_json", "squeue --json", lab.command(["squeue", "--json"], lines=False)),
        Variant("p_jobid", "squeue --noheader -o %i",
                lab.command(["squeue", "--noheader", "-o", "%i"])),
        Variant("p_user", "squeue --user=root --noheader -o %i",
                lab.command(["squeue", "--user=root", "--noheader", "-o", "%i"])),
        Variant("p_sinfo", "sinfo (plain)", lab.command(["sinfo"])),
    ]  # fmt: skip
    return out


async def measure_size(lab: Lab, n: int) -> dict[str, Any]:
    since: dict[str, int | None] = {"t": await lab.last_update()}
    log(f"{lab.release}: slurmrestd last_update {since['t']}")
    found: dict[str, Any] = {}
    for v in await variants(lab, since):
        if v.key == "e_rest_no_change":
            since["t"] = await lab.last_update()
        found[v.key] = await lab.measure(v)
    sample: dict[str, str] = {}
    if lab.release != "22.05":
        rc, out, err = await lab.exec(["squeue", "--only-job-state", "--states=all"])
        sample["only_job_state_head"] = (out or err).decode(errors="replace")[:400]
    return {"jobs": n, "variants": found, "samples": sample}


async def restd_study(lab: Lab, touch: str) -> dict[str, Any]:
    """What "no change since" answers: nothing changed, then one job changed."""
    t = await lab.last_update()
    data, size = await lab.rest_get(f"?update_time={t}")
    quiet = {
        "jobs": len(data.get("jobs") or []),
        "bytes": size,
        "update_time": t,
        "answer": json.dumps({k: v for k, v in data.items() if k != "meta"})[:400],
    }
    await lab.exec(["scontrol", "update", f"JobId={touch}", "Name=touched"])
    await asyncio.sleep(0.5)
    data, size = await lab.rest_get(f"?update_time={t}")
    changed = {"jobs": len(data.get("jobs") or []), "bytes": size}
    log(f"{lab.release}: update_time unchanged -> {quiet}; one job changed -> {changed}")
    polls_quiet = await lab.no_change_study(10, None)
    polls_busy = await lab.no_change_study(5, touch)
    log(f"{lab.release}: polling 1/s, quiet: {polls_quiet['no_change_answers']}/"
        f"{polls_quiet['polls']} no-change; one job changed per second: "
        f"{polls_busy['no_change_answers']}/{polls_busy['polls']}")  # fmt: skip
    return {
        "unchanged": quiet,
        "one_job_changed": changed,
        "poll_1s_quiet": polls_quiet,
        "poll_1s_one_change_per_s": polls_busy,
    }


async def one_release(release: str, sizes: list[int], reps: int, work: Path) -> dict[str, Any]:
    bs = BenchStack(
        root=work,
        name=f"listing{release.replace('.', '')}",
        overrides={"slurm": release, "nodes": 2, "node_cpus": 2,
                   "max_job_count": max(20_000, 2 * max(sizes))},
    )  # fmt: skip
    try:
        await bs.up()
        lab = Lab(bs, release, reps)
        running = await submit_many(
            bs,
            RUNNING_JOBS,
            ["--comment=relaunch=on", "--output=/dev/null", "--wrap", "sleep 3600"],
        )
        lab.running = sorted(running, key=int)
        held_args = ["--hold", "--comment=relaunch=on", "--job-name=held", "--output=/dev/null",
                     "--wrap", "true"]  # fmt: skip
        held: list[str] = []
        out: dict[str, Any] = {"release": release, "sizes": {}}
        for n in sorted(sizes):
            t0 = time.monotonic()
            held += await submit_many(bs, n - len(held), held_args, parallel=16)
            log(f"{release}: {len(held)} held jobs (+{RUNNING_JOBS} running) in "
                f"{time.monotonic() - t0:.0f}s")  # fmt: skip
            await asyncio.sleep(3)
            out["sizes"][str(n)] = await measure_size(lab, n)
        out["running_job_ids"] = running
        try:
            out["update_time"] = await restd_study(lab, held[0])
        except BenchError as exc:
            out["update_time"] = {"error": str(exc)[:400]}
        return out
    finally:
        log(f"{release}: taking the stack down")
        bs.down()


# ------------------------------------------------------------------------------------ report

COLUMNS = (
    ("wall ms", "wall_ms_p50"),
    ("client CPU ms", "client_cpu_ms_p50"),
    ("parse CPU ms", "parse_cpu_ms_p50"),
    ("bytes", "out_bytes"),
    ("records", "records"),
    ("RPCs/call", "rpcs_per_call_total"),
    ("slurmctld RPC ms", "slurmctld_rpc_ms_per_call"),
    ("slurmctld CPU ms", "slurmctld_cpu_ms_per_call"),
)


def table(size: dict[str, Any]) -> list[str]:
    head = "| variant | " + " | ".join(c for c, _ in COLUMNS) + " | RPC types per call |"
    rows = [head, "|" + "---|" * (len(COLUMNS) + 2)]
    for key, v in size["variants"].items():
        if "error" in v:
            rows.append(f"| {key}: {v['what']} | " + " | ".join("–" for _ in COLUMNS)
                        + f" | error: {v['error'][:120]} |")  # fmt: skip
            continue
        cells = []
        for _, col in COLUMNS:
            val = v.get(col)
            cells.append(
                "–"
                if val is None or val == -1
                else f"{val:g}"
                if isinstance(val, float)
                else str(val)
            )
        types = ", ".join(
            f"{k.removeprefix('REQUEST_')} {c:g}" for k, c in v["rpcs_per_call"].items()
        )
        if v.get("note"):
            types += f"; {v['note'][:100]}"
        if v.get("slurmrestd_cpu_ms_per_call"):
            types += f" (slurmrestd CPU {v['slurmrestd_cpu_ms_per_call']:g} ms)"
        rows.append(f"| {key}: {v['what']} | " + " | ".join(cells) + f" | {types or '–'} |")
    return rows


def markdown(data: dict[str, Any]) -> str:
    lines = ["# Listing cost", "",
             "Each way to list jobs, one call at a time; per call: wall p50, the listing "
             "process's CPU (and Relaunch's parse), bytes of output, slurmctld's RPCs by type "
             "and time serving them (sdiag, less an idle window as long), slurmctld's CPU. "
             "`python bench/listing_cost.py` (bench/listing_cost.py).", ""]  # fmt: skip
    for release, rel in sorted(data.get("releases", {}).items()):
        lines.append(
            f"## Slurm {release} ({rel.get('measured_at', '?')}, {rel.get('reps')} calls each)"
        )
        for n, size in rel["sizes"].items():
            lines += ["", f"### {n} held jobs + {RUNNING_JOBS} running", "", *table(size)]
            if size.get("samples", {}).get("only_job_state_head"):
                head = size["samples"]["only_job_state_head"].splitlines()[:3]
                lines += [
                    "",
                    "`squeue --only-job-state` prints: " + " / ".join(f"`{h}`" for h in head),
                ]
        ut = rel.get("update_time", {})
        if ut and "error" not in ut:
            q, c = ut["unchanged"], ut["one_job_changed"]
            pq, pb = ut["poll_1s_quiet"], ut["poll_1s_one_change_per_s"]
            lines += ["", f"slurmrestd `update_time`: nothing changed → {q['jobs']} jobs, "
                      f"{q['bytes']} B; one job changed → {c['jobs']} jobs, {c['bytes']} B. "
                      f"Polling once a second with the last answer's `last_update`: quiet queue "
                      f"{pq['no_change_answers']}/{pq['polls']} no-change answers; one job "
                      f"changed each second {pb['no_change_answers']}/{pb['polls']}."]  # fmt: skip
        elif ut:
            lines += ["", f"slurmrestd `update_time`: {ut['error']}"]
        lines.append("")
    return "\n".join(lines) + "\n"


def write(data: dict[str, Any], results: Path) -> None:
    results.mkdir(parents=True, exist_ok=True)
    (results / "listing_cost.json").write_text(json.dumps(data, indent=2) + "\n")
    (results / "listing_cost.md").write_text(markdown(data))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--releases",
        default=",".join(RELEASES),
        help=f"Slurm releases, comma-separated (of {', '.join(RELEASES)})",
    )
    p.add_argument(
        "--sizes", default="10000", help="held jobs in the queue, comma-separated (e.g. 1000,10000)"
    )
    p.add_argument("--reps", type=int, default=5, help="calls per variant (default 5)")
    p.add_argument("--results", type=Path, default=RESULTS, help="where the results go")
    args = p.parse_args(argv)
    try:
        args.sizes = sorted({int(s) for s in str(args.sizes).split(",") if s.strip()})
    except ValueError:
        p.error("--sizes: whole numbers, comma-separated")
    if not args.sizes or min(args.sizes) < 1 or max(args.sizes) > 100_000:
        p.error("--sizes: between 1 and 100000")
    args.releases = [r.strip() for r in str(args.releases).split(",") if r.strip()]
    if not args.releases or any(r not in RELEASES for r in args.releases):
        p.error(f"--releases: of {', '.join(RELEASES)}")
    if not 1 <= args.reps <= 100:
        p.error("--reps: between 1 and 100")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    path = args.results / "listing_cost.json"
    data: dict[str, Any] = {"releases": {}}
    with contextlib.suppress(OSError, ValueError):
        data = json.loads(path.read_text())
    for release in args.releases:
        work = Path(tempfile.mkdtemp(prefix="relaunch-listing-"))
        try:
            found = asyncio.run(one_release(release, args.sizes, args.reps, work))
        except BenchError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
        finally:
            shutil.rmtree(work, ignore_errors=True)
        found["reps"] = args.reps
        found["measured_at"] = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
        data.setdefault("releases", {})[release] = found
        write(data, args.results)
    print(markdown(data))
    return 0


if __name__ == "__main__":
    sys.exit(main())
