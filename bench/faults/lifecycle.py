"""The node lifecycle, measured: how long a node Relaunch drains stays out of service.

On a private stack (autonomous mode, the dev stack's lifecycle: settle 5 s, a reboot restarts
the node's slurmd, the `dev-gpu` check sees the fault injector's marker), a user's job runs on
a node when its GPU fails and the node dies (slurmd and the job's processes killed, Xid 79 in
its kernel log, the GPU fault marked):

- transient faults (the marker gone by the time the node is back): *fault → back in service*,
  and the time the healthy node spent out of service (drained → back), with the lifecycle, and
  without it (the node stays out until a person resumes it: observed for a fixed window);
- a persistent fault (the marker stays): *fault → repair ticket* on a real HTTP receiver, then
  *repair reported → back in service* once the marker is removed and `relaunch nodes returned`
  says so.

Times are read from the outside: Slurm's node state polled every 0.25 s, the receiver's clock.
The lifecycle's own audit rows give the breakdown (diagnosing, remediating, validating).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from bench.faults.common import ROOT, BenchError, BenchStack, log, pct
from relaunch.connectors.audit import AuditStore
from relaunch.devstack import faults
from relaunch.models.config import WatchSettings
from relaunch.models.lifecycle import LifecycleSettings, lifecycle_id
from relaunch.models.recovery import Mode, Policy
from relaunch.models.scheduler import NodeFlag, NodeState

POLICY = Policy(mode=Mode.AUTONOMOUS, drain_share=1.0, drain_cap=50, verify_timeout_s=60)


class _Receiver(BaseHTTPRequestHandler):
    tickets: list[tuple[float, dict[str, Any]]] = []

    def do_POST(self) -> None:  # noqa: N802 - the stdlib's name
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        _Receiver.tickets.append((time.monotonic(), json.loads(body or b"{}")))
        answer = json.dumps({"ticket": f"BENCH-{len(_Receiver.tickets)}"}).encode()
        self.send_response(201)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the stdlib's name
        pass


def _out(node: Any) -> bool:
    return (
        node.drain_flag
        or node.state is NodeState.DOWN
        or not node.responding
        or NodeFlag.MAINTENANCE in node.flags
    )


async def _watch_node(
    bs: BenchStack, node: str, stop: asyncio.Event, seen: dict[str, float]
) -> None:
    """Note in ``seen`` when (monotonic) the node was first out of service, and first back."""
    sched = bs.sched()
    while not stop.is_set():
        try:
            n = await sched.get_node(node)
        except Exception:  # noqa: BLE001 - a read refused under load: read again
            await asyncio.sleep(0.25)
            continue
        t = time.monotonic()
        if _out(n):
            seen.setdefault("out", t)
        elif "out" in seen and "back" not in seen:
            seen["back"] = t
        await asyncio.sleep(0.25)


def _victim(bs: BenchStack, node: str, work: Path) -> str:
    env = {**os.environ, **bs.s.slurm_env}
    job = subprocess.run(
        [
            "sbatch", "--parsable", "-w", node, "-N1", "-J", "victim",
            f"--comment=relaunch=on,relaunch_cluster={bs.cfg.name}",
            "-o", str(work / f"victim-{node}-%j.out"),
        ],
        input="#!/bin/sh\nsleep 900\n", env=env, capture_output=True, text=True, check=True,
    ).stdout.strip().split(";")[0]  # fmt: skip
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        state = subprocess.run(
            ["squeue", "-h", "-j", job, "-o", "%T"], env=env, capture_output=True, text=True
        ).stdout.strip()
        if state == "RUNNING":
            time.sleep(2)  # the watcher has seen it run
            return job
        time.sleep(0.3)
    raise BenchError(f"victim job {job} on {node} did not start")


async def _round(
    bs: BenchStack,
    audit: AuditStore,
    node: str,
    n: int,
    work: Path,
    *,
    persist: bool,
    wait_s: float,
) -> dict[str, Any]:
    """One fault on ``node``; returns its times (seconds from the fault)."""
    home = bs.s.home()
    node_dir = home.root / "nodes" / node
    job = await asyncio.to_thread(_victim, bs, node, work)
    stop = asyncio.Event()
    seen: dict[str, float] = {}
    watcher = asyncio.create_task(_watch_node(bs, node, stop, seen))
    faults.mark_gpu_fault(node_dir)
    fault = time.monotonic()
    fault_utc = datetime.now(UTC)
    await asyncio.to_thread(faults.kill_node, bs.s.slurm, node, kernel_log=bs.node_log(node))
    if not persist:
        faults.clear_gpu_fault(node_dir)  # gone by the time the node is back
    lid = lifecycle_id(bs.cfg.name, node, n)
    row: dict[str, Any] = {"node": node, "persistent": persist, "lifecycle": lid}
    deadline = fault + wait_s
    tickets_before = len(_Receiver.tickets)
    while time.monotonic() < deadline:
        await asyncio.sleep(0.5)
        if persist and len(_Receiver.tickets) > tickets_before:
            row["ticket_s"] = _Receiver.tickets[-1][0] - fault
            break
        if not persist and "back" in seen:
            break
    stop.set()
    await watcher
    if "out" in seen:
        row["drained_s"] = seen["out"] - fault
    if "back" in seen:
        row["back_s"] = seen["back"] - fault
        row["out_of_service_s"] = seen["back"] - seen["out"]
    else:
        row["still_out_after_s"] = time.monotonic() - fault
    stages = {
        e.stage: (e.at - fault_utc).total_seconds()
        for e in await audit.events(lid)
        if e.kind == "node_stage" and e.stage
    }
    row["stages_s"] = stages
    # The victim, requeued by its recovery, would hold a CPU of another node: gone.
    subprocess.run(
        ["scancel", job], env={**os.environ, **bs.s.slurm_env}, capture_output=True, timeout=30
    )
    return row


async def _repaired(bs: BenchStack, node: str, wait_s: float) -> dict[str, Any]:
    """The persistent fault repaired: the marker removed, `relaunch nodes returned` said."""
    faults.clear_gpu_fault(bs.s.home().root / "nodes" / node)
    told = time.monotonic()
    done = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "relaunch.cli", "nodes", "returned", node, "--by", "bench",
         "--config", str(bs.root / f"{bs.name}.json")],
        capture_output=True, text=True, cwd=ROOT, timeout=60,
    )  # fmt: skip
    if done.returncode != 0:
        raise BenchError(f"relaunch nodes returned {node}: {done.stderr.strip()[-300:]}")
    sched = bs.sched()
    while time.monotonic() - told < wait_s:
        n = await sched.get_node(node)
        if not _out(n):
            return {"node": node, "repair_to_back_s": time.monotonic() - told}
        await asyncio.sleep(0.25)
    return {"node": node, "still_out_after_s": time.monotonic() - told}


async def measure(root: Path, *, rounds: int = 3, without_s: float = 90.0) -> dict[str, Any]:
    """The lifecycle part of `make bench` on a stack of its own (see the module's docstring)."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Receiver)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/tickets"
    _Receiver.tickets = []
    bs = BenchStack(
        root, "life", {"cred_expire": 10}, policy=POLICY, watch=WatchSettings(poll_interval_s=1.0)
    )
    work = root / "work-life"
    work.mkdir(exist_ok=True)
    work.chmod(0o777)
    out: dict[str, Any] = {"rounds": [], "without": None, "repair": None}
    try:
        await bs.up()
        bs.config = bs.cfg.model_copy(
            update={
                "lifecycle": LifecycleSettings.model_validate(
                    {**bs.s.lifecycle_settings(bs.s.home()).model_dump(), "repair_webhook": url}
                )
            }
        )
        bs.write_config()
        for proc in ("worker",):
            bs.procs[proc].terminate()
            bs.procs[proc].wait(timeout=30)
            bs.start_proc(proc)
        await asyncio.sleep(5)  # the worker polls again
        audit = await AuditStore.open(bs.s.database_url)
        try:
            nodes = bs.s.slurm.nodes
            for i in range(rounds):
                node = nodes[i % (len(nodes) - 1)]
                n = 1 + sum(1 for r in out["rounds"] if r["node"] == node)
                row = await _round(bs, audit, node, n, work, persist=False, wait_s=180)
                log(f"lifecycle: transient fault on {node}: {json.dumps(row, default=str)}")
                out["rounds"].append(row)
                await bs.wait_idle(30)
            last = nodes[-1]
            row = await _round(bs, audit, last, 1, work, persist=True, wait_s=180)
            log(f"lifecycle: persistent fault on {last}: {json.dumps(row, default=str)}")
            out["rounds"].append(row)
            out["repair"] = await _repaired(bs, last, 180)
            log(f"lifecycle: repaired: {json.dumps(out['repair'])}")
            # Without the lifecycle: the same transient fault, and nobody comes.
            bs.config = bs.cfg.model_copy(update={"lifecycle": LifecycleSettings(enabled=False)})
            bs.write_config()
            bs.procs["worker"].terminate()
            bs.procs["worker"].wait(timeout=30)
            bs.start_proc("worker")
            await asyncio.sleep(5)
            row = await _round(bs, audit, nodes[0], 99, work, persist=False, wait_s=without_s)
            log(f"lifecycle: without it: {json.dumps(row, default=str)}")
            out["without"] = row
        finally:
            await audit.close()
    finally:
        bs.down()
        server.shutdown()
    return out


def markdown(result: dict[str, Any] | None) -> list[str]:
    """The lifecycle's section of REPORT.md (and all of lifecycle.md)."""
    if not result:
        return []
    transient = [r for r in result["rounds"] if not r["persistent"]]
    back = [r["back_s"] for r in transient if "back_s" in r]
    out_s = [r["out_of_service_s"] for r in transient if "out_of_service_s" in r]
    persistent = next((r for r in result["rounds"] if r["persistent"]), None)
    without = result.get("without") or {}
    L = [
        "## Node lifecycle: from drained to back in service",
        "",
        "A user's job on a node whose GPU fails and which dies (slurmd and the job's processes "
        "killed, Xid 79 in its kernel log, the dev cluster's GPU fault marked); autonomous mode, "
        "the dev stack's lifecycle (settle 5 s; a reboot restarts the node's slurmd). Times from "
        "the fault, read from Slurm's node state every 0.25 s (bench/faults/lifecycle.py).",
        "",
        "| | runs | p50 (s) | max (s) |",
        "|---|---|---|---|",
        f"| transient fault → node back in service | {len(back)} of {len(transient)} | "
        f"{pct(back, 50):.1f} | {max(back, default=float('nan')):.1f} |",
        f"| healthy node out of service (drained → back), with the lifecycle | {len(out_s)} | "
        f"{pct(out_s, 50):.1f} | {max(out_s, default=float('nan')):.1f} |",
    ]
    if without:
        if "out_of_service_s" in without:
            L.append(
                f"| the same, without the lifecycle | 1 | {without['out_of_service_s']:.1f} | "
                f"{without['out_of_service_s']:.1f} |"
            )
        else:
            L.append(
                f"| the same, without the lifecycle | 1 | still out after "
                f"{without.get('still_out_after_s', 0):.0f} s (until a person resumes it) | |"
            )
    if persistent is not None:
        ticket = persistent.get("ticket_s")
        L.append(
            f"| persistent fault → repair ticket posted | 1 | {ticket:.1f} | |"
            if ticket is not None
            else "| persistent fault → repair ticket | 1 | none posted | |"
        )
    repair = result.get("repair") or {}
    if "repair_to_back_s" in repair:
        L.append(
            f"| repair reported (`relaunch nodes returned`) → validated, back in service | 1 | "
            f"{repair['repair_to_back_s']:.1f} | |"
        )
    L += ["", "Each transient run, the lifecycle's stages (s from the fault):", ""]
    for r in transient:
        stages = ", ".join(
            f"{k} {v:.1f}" for k, v in sorted(r["stages_s"].items(), key=lambda kv: kv[1])
        )
        L.append(f"- {r['node']}: drained at {r.get('drained_s', float('nan')):.1f}; {stages}")
    L.append("")
    return L
