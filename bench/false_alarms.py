"""False alarms: the DDP example with long, legitimate pauses (slow checkpoint saves and
evaluations) watched by Relaunch at its DEFAULT watch settings, in monitor mode (nothing acts).
Every detection for the job is a false alarm: the job never fails. Writes
bench/results/false_alarms.md and false_alarms.json.

Usage: python bench/false_alarms.py [--minutes 30]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import shutil
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.faults.common import BenchStack, LogTail, log, submit_ddp  # noqa: E402
from bench.run import code_version  # noqa: E402
from relaunch.connectors.audit import AuditStore  # noqa: E402
from relaunch.models.config import WatchSettings  # noqa: E402
from relaunch.models.errors import RelaunchError  # noqa: E402
from relaunch.models.recovery import Mode, Policy  # noqa: E402

RESULTS = ROOT / "bench" / "results"
CKPT_EVERY, CKPT_PAUSE = 50, 20.0
EVAL_EVERY, EVAL_PAUSE = 120, 30.0
STEP_SLEEP = 0.2
TRAIN_ARGS = [
    "--step-sleep", str(STEP_SLEEP), "--ckpt-every", str(CKPT_EVERY),
    "--ckpt-pause", str(CKPT_PAUSE), "--eval-every", str(EVAL_EVERY),
    "--eval-pause", str(EVAL_PAUSE), "--pg-timeout", "600",
]  # fmt: skip
LABEL = re.compile(r"^\s*(\d+): (.*)$")
STEP = re.compile(r"^step=(\d+) ")
SAVED = re.compile(r"^checkpoint saved step=(\d+)")
EVAL = re.compile(r"^evaluation started step=(\d+)")


def pauses(lines: list[tuple[datetime, str]]) -> dict[str, Any]:
    """Gaps between consecutive step lines of each rank, by what happened between them:
    a checkpoint save (rank 0 saves; rank 1 waits in its next all-reduce, so the gap follows the
    save step there too), an evaluation, both, or nothing (an ordinary step)."""
    last: dict[str, tuple[datetime, int]] = {}
    ckpts: set[int] = set()
    evals: set[int] = set()
    gaps: dict[str, list[float]] = {}
    for at, raw in lines:
        m = LABEL.match(raw)
        if not m:
            continue
        rank, text = m.groups()
        if s := SAVED.match(text):
            ckpts.add(int(s.group(1)))
        elif e := EVAL.match(text):
            evals.add(int(e.group(1)))
        elif st := STEP.match(text):
            step = int(st.group(1))
            if rank in last and last[rank][1] == step - 1:
                prev = step - 1
                ck = prev % CKPT_EVERY == 0
                ev = prev % EVAL_EVERY == 0
                kind = (
                    "checkpoint+evaluation"
                    if ck and ev
                    else "checkpoint"
                    if ck
                    else "evaluation"
                    if ev
                    else "step"
                )
                gaps.setdefault(kind, []).append((at - last[rank][0]).total_seconds())
            last[rank] = (at, step)
    return {
        "checkpoints_saved": len(ckpts),
        "evaluations": len(evals),
        "max_step": max((s for _, s in last.values()), default=0),
        "gaps": {
            k: {
                "count": len(v),
                "max_s": round(max(v), 2),
                "median_s": round(sorted(v)[len(v) // 2], 2),
            }
            for k, v in sorted(gaps.items())
        },
    }


def pause_at(lines: list[tuple[datetime, str]], at: datetime) -> str:
    """The last step printed before ``at`` and what the job was doing after it."""
    steps = [
        (t, int(m.group(1)))
        for t, raw in lines
        if t <= at and (lm := LABEL.match(raw)) and (m := STEP.match(lm.group(2)))
    ]
    if not steps:
        return "before the first step"
    t, step = max(steps, key=lambda s: s[1])
    kinds = [
        k
        for k, every in (("checkpoint", CKPT_EVERY), ("evaluation", EVAL_EVERY))
        if step % every == 0
    ]
    doing = " + ".join(kinds) or "no pause"
    return f"step {step} printed {(at - t).total_seconds():.0f} s before ({doing})"


async def detections(bs: BenchStack, job_id: str) -> list[dict[str, Any]]:
    """Every detection row of the audit trail for this job (all its incidents)."""
    audit = await AuditStore.open(bs.s.database_url)
    try:
        found = []
        for inc in await audit.incidents(cluster=bs.cfg.name, job_id=job_id, limit=1000):
            for ev in await audit.events(inc.id):
                if ev.kind == "detection":
                    found.append(
                        {
                            "incident": inc.id,
                            "at": ev.at.isoformat(),
                            "kind": str(ev.data.get("kind") or ""),
                            "summary": ev.summary[:200],
                        }
                    )
        return found
    finally:
        await audit.close()


def watcher_lines(path: Path, job_id: str) -> list[str]:
    """The watcher log's lines about this job (each recovery it started names the job and the
    detection's kind: ``started relaunch-<cluster>-<job>-<n>: job <id> attempt <n> <kind>``)."""
    if not path.exists():
        return []
    rx = re.compile(rf"\bjob {re.escape(job_id)}\b")
    text = path.read_text(errors="replace")
    return [line.strip()[:300] for line in text.splitlines() if rx.search(line)]


async def run(args: argparse.Namespace) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix="relaunch-bench-fa-"))
    root.chmod(0o755)
    work = root / "work"
    work.mkdir()
    work.chmod(0o777)
    watch = WatchSettings()
    policy = Policy(mode=Mode.MONITOR)
    bs = BenchStack(root, "fa", {"cred_expire": 10}, policy=policy, watch=watch)
    started = datetime.now(UTC)
    out: dict[str, Any] = {
        "command": " ".join(["python bench/false_alarms.py", *sys.argv[1:]]),
        "date": f"{started:%Y-%m-%d %H:%M} UTC",
        "code": code_version(),
        "minutes": args.minutes,
        "train_args": TRAIN_ARGS,
        "watch_settings": watch.model_dump(),
        "policy_mode": policy.mode.value,
    }
    tail: LogTail | None = None
    try:
        await bs.up()
        job_id = await asyncio.to_thread(
            submit_ddp, bs, workdir=work, ckpt_dir=work / "ckpt", args=TRAIN_ARGS, port=24555
        )
        out["job"] = job_id
        tail = LogTail(work / f"train-{job_id}.out")
        tail.start()
        await tail.wait(lambda t: t.max_step() >= 1, f"job {job_id}'s first step", 180)
        t0 = time.monotonic()
        log(f"job {job_id} training; watching for {args.minutes} min")
        while (left := args.minutes * 60 - (time.monotonic() - t0)) > 0:
            await asyncio.sleep(min(60.0, left))
            log(f"{(time.monotonic() - t0) / 60:.0f} min: step {tail.max_step()}")
        out["watched_s"] = round(time.monotonic() - t0, 1)
        await tail.stop()
        out["pauses"] = pauses(tail.lines)
        out["job_state"] = (await bs.sched().get_job(job_id)).state.value
        out["detections"] = await detections(bs, job_id)
        for det in out["detections"]:
            det["job_was"] = pause_at(tail.lines, datetime.fromisoformat(det["at"]))
        out["watcher_lines"] = watcher_lines(root / "fa-watch.log", job_id)
        starts = [line for line in out["watcher_lines"] if " started relaunch-" in line]
        # The audit trail's rows; the watcher's own log where the trail has none (a worker
        # that failed before recording still leaves the watcher's line).
        out["false_alarms"] = len(out["detections"]) or len(starts)
    finally:
        if tail is not None:
            await tail.stop()
        bs.down()
        if args.keep:
            log(f"kept {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)
    return out


def markdown(r: dict[str, Any]) -> str:
    p = r["pauses"]
    w = r["watch_settings"]
    dets = r["detections"]
    lines = [
        "# False alarms: the DDP example with long pauses, watched at default settings",
        "",
        f"- Date: {r['date']}; command: `{r['command']}`; watched {r['watched_s'] / 60:.1f} min "
        f"(job {r['job']}, state at the end: {r['job_state']}); code: {r.get('code', '?')}.",
        "- Stack: a private local stack (`BenchStack`): Relaunch's worker and watcher at the "
        f"DEFAULT watch settings, policy mode **{r['policy_mode']}** (nothing acts).",
        f"- Watcher settings in effect: `hang_threshold_s={w['hang_threshold_s']:g}`, "
        f"`poll_interval_s={w['poll_interval_s']:g}`; "
        + ", ".join(
            f"`{k}={v}`"
            for k, v in w.items()
            if k not in ("hang_threshold_s", "poll_interval_s", "partitions", "opt_in_comment")
        )
        + ".",
        f"- The job: `examples/train_ddp.py {' '.join(r['train_args'])}` (2 ranks, one per "
        "node): rank 0 spends 20 s more in each checkpoint save (rank 1 waits in its next "
        "all-reduce); every rank evaluates for 30 s every 120 steps. Steps 600, 1200, … are "
        "both: a 50 s pause.",
        "",
        "## Pauses seen (gaps between a rank's consecutive step lines, from the job log)",
        "",
        f"{p['checkpoints_saved']} checkpoints saved, {p['evaluations']} evaluations, last step "
        f"{p['max_step']}.",
        "",
        "| pause kind | gaps | longest (s) | median (s) |",
        "|---|---|---|---|",
    ]
    for kind, g in p["gaps"].items():
        lines.append(f"| {kind} | {g['count']} | {g['max_s']:.1f} | {g['median_s']:.1f} |")
    lines += [
        "",
        f"## Detections for the job: {r['false_alarms']} (expected 0)",
        "",
    ]
    if dets:
        lines += ["| at | kind | the job then | incident | summary |", "|---|---|---|---|---|"]
        lines += [
            f"| {d['at']} | {d['kind']} | {d.get('job_was', '?')} | {d['incident']} | "
            f"{d['summary']} |"
            for d in dets
        ]
    else:
        lines.append("No detection row in the audit trail.")
    if r.get("watcher_lines"):
        lines += ["", "The watcher's log lines about the job:", "", "```"]
        lines += r["watcher_lines"][:50] + ["```"]
    return "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--minutes", type=float, default=30.0, help="how long to watch (default 30)")
    p.add_argument("--results", type=Path, default=RESULTS, help="where to write the results")
    p.add_argument("--keep", action="store_true", help="keep the temporary directory")
    p.add_argument(
        "--fail-on-detection", action="store_true", help="exit 1 when any detection was made"
    )
    p.add_argument(
        "--report-only", action="store_true", help="re-render false_alarms.md from its .json"
    )
    args = p.parse_args()
    if args.minutes <= 0:
        p.error("--minutes must be positive")
    if args.report_only:
        raw = args.results / "false_alarms.json"
        if not raw.exists():
            p.error(f"{raw} not found: it is written by a run")
        text = markdown(json.loads(raw.read_text()))
        (args.results / "false_alarms.md").write_text(text)
        print(text)
        return
    try:
        result = asyncio.run(run(args))
    except RelaunchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(1)
    args.results.mkdir(parents=True, exist_ok=True)
    (args.results / "false_alarms.json").write_text(json.dumps(result, indent=1, default=str))
    text = markdown(result)
    (args.results / "false_alarms.md").write_text(text)
    print(text)
    if args.fail_on_detection and result["false_alarms"]:
        sys.exit(1)


if __name__ == "__main__":
    main()
