"""The restart paths' report (restart.md, summary.json, and its section of REPORT.md), and the
goodput figure: the effective training time of a 16,384-GPU job at Llama 3's interruption rate,
for each restart path and for Slurm alone, in ml-goodput-measurement's badput categories."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from bench.faults.restart import PATHS, PHASES, SUMMARY_KEYS

# Llama 3 (Meta, "The Llama 3 Herd of Models", 2024, §3.3.4): 419 unexpected interruptions in
# a 54-day snapshot of pre-training on 16,384 H100 GPUs (466 in all, 47 of them planned).
GPUS = 16_384
INTERRUPTIONS = 419
DAYS = 54
# How the measured classes stand for every interruption: Mix A's shares
# (docs/failure-signatures.md §4), a node failure counted half silent.
WEIGHTS = {"gpu_hardware": 40.0, "node_failure": 4.5, "silent_node_crash": 4.5}
MARK = "<!-- restart-paths -->"
END = "<!-- /restart-paths -->"


def goodput(
    summary: dict[str, Any], *, ckpt_interval_min: float, human_response_min: float
) -> dict[str, Any]:
    """Effective training time ratio per path (and Slurm alone) over DAYS with INTERRUPTIONS,
    each costing that path's measured seconds (weighted over the measured classes) plus the
    progress since the last checkpoint (half the interval, on average).

    Badput categories modelled (ml-goodput-measurement's BadputType):
    INFRASTRUCTURE_RECOVERY_FROM_DISRUPTION (fault → the job runs again: detection, decision,
    action, back in the allocation or scheduled), PROGRAM_STARTUP (process start and the ranks'
    rendezvous), UNPRODUCTIVE_CHECKPOINT_RESTORE_TIME (checkpoint load and the first step),
    WASTED_PROGRESS_FROM_DISRUPTION (half a checkpoint interval). Not modelled (the same for
    every path, or not an interruption's): TPU_INITIALIZATION, TRAINING_PREP, DATA_LOADING_*,
    UNPRODUCTIVE_CHECKPOINT_SAVE_TIME, CUSTOM_BADPUT_EVENTS, OTHER."""
    total_s = DAYS * 86400.0
    wasted = ckpt_interval_min * 60 / 2
    out: dict[str, Any] = {
        "gpus": GPUS,
        "interruptions": INTERRUPTIONS,
        "days": DAYS,
        "checkpoint_interval_min": ckpt_interval_min,
        "human_response_min": human_response_min,
        "weights": WEIGHTS,
        "paths": {},
    }
    for path in PATHS:
        phases = _weighted_phases(summary, path)
        if phases is None:
            continue
        badput = {
            "INFRASTRUCTURE_RECOVERY_FROM_DISRUPTION": sum(
                phases[k] for k in ("detect_s", "decide_s", "act_s", "back_s")
            ),
            "PROGRAM_STARTUP": phases["launch_s"] + phases["rendezvous_s"],
            "UNPRODUCTIVE_CHECKPOINT_RESTORE_TIME": phases["restore_s"] + phases["step_s"],
            "WASTED_PROGRESS_FROM_DISRUPTION": wasted,
        }
        out["paths"][path] = _ettr(badput, total_s)
    requeue = out["paths"].get("requeue")
    if requeue is not None:
        # Slurm alone: the job fails (a lost GPU or node ends it), a person notices and
        # requeues it; then it comes back as the requeue path does once acted on.
        per = dict(requeue["badput_s_per_interruption"])
        per["INFRASTRUCTURE_RECOVERY_FROM_DISRUPTION"] += human_response_min * 60
        out["paths"]["slurm_alone"] = _ettr(per, total_s)
    return out


def _ettr(badput: dict[str, float], total_s: float) -> dict[str, Any]:
    lost = {k: v * INTERRUPTIONS for k, v in badput.items()}
    restart = sum(v for k, v in badput.items() if k != "WASTED_PROGRESS_FROM_DISRUPTION")
    return {
        "ettr_restart_only": round(1 - restart * INTERRUPTIONS / total_s, 6),
        "badput_s_per_interruption": {k: round(v, 2) for k, v in badput.items()},
        "badput_share": {k: round(v / total_s, 5) for k, v in lost.items()},
        "effective_training_time_ratio": round(1 - sum(lost.values()) / total_s, 5),
        "downtime_per_interruption_s": round(sum(badput.values()), 2),
    }


def _weighted_phases(summary: dict[str, Any], path: str) -> dict[str, float] | None:
    acc: dict[str, float] = {}
    weight = 0.0
    for cls, w in WEIGHTS.items():
        entry = summary.get(cls, {}).get(path)
        if not entry:
            continue
        phases = entry["phases_p50"]
        if any(phases.get(k) is None for k, _ in PHASES):
            continue
        for k, _ in PHASES:
            acc[k] = acc.get(k, 0.0) + w * float(phases[k])
        weight += w
    if not weight:
        return None
    return {k: v / weight for k, v in acc.items()}


def render(summary: dict[str, Any], good: dict[str, Any], meta: dict[str, Any]) -> str:
    """The restart paths' section (Markdown)."""
    lines = [
        "## Restart paths side by side (spare, requeue, resubmit)",
        "",
        f"- {meta.get('when', '')}; `python bench/run.py {meta.get('argv', '')}`; "
        f"{meta.get('machine', '')}",
        "- The same real faults (bench/faults/scenarios.py) on rank 1's node or, on the spare "
        "path, on a training node that is not the job's batch host. **spare**: "
        "examples/jobs/train_elastic.sbatch, 3 nodes of which 2 train under torchrun "
        "(`--comment relaunch=on,train_nodes=2`): Relaunch takes the node out of the running job "
        "and ends its step; the job's script starts it again on the rest. **requeue**: the "
        "2-node DDP job, `scontrol requeue` (cred_expire 10 s). **resubmit**: the same job, "
        "cancelled and submitted again (`restart_method: resubmit`). Each path on a private "
        "stack of its own, one after the other.",
        "",
        "| class | path | runs | fault → running p50 (s) | fault → first step p50 (s) | "
        "work lost p50 (steps) | right node drained | false drains | requeued | errors |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for cls, by_path in summary.items():
        for path in PATHS:
            e = by_path.get(path)
            if not e:
                continue
            lines.append(
                f"| {cls} | {path} | {e['runs']} | {_f(e['fault_to_running_p50'])} | "
                f"{_f(e['fault_to_first_step_p50'])} | {_f(e['work_lost_steps_p50'])} | "
                f"{e['right_node_drained']}/{e['runs']} | {', '.join(e['false_drains']) or 0} | "
                f"{e['requeued']} | {len(e['errors'])} |"
            )
    lines += [
        "",
        "The lab is idle: a resubmitted job (a new job id, no `cred_expire` hold) starts at "
        "once, so resubmission is as quick as the spare path here; on a busy cluster it (and a "
        "requeued job) waits in the queue for free nodes, while a job with a spare never leaves "
        "its allocation. The spare path's process start is the torchrun agents' (an interpreter "
        "importing torch, the rendezvous) before the worker they fork: its worker's lines come "
        "within milliseconds of each other, so rendezvous and checkpoint load read about 0.",
    ]
    lines += ["", "### Where the seconds go (p50 of each phase, s)", ""]
    lines.append("| class | path | " + " | ".join(name.split(" (")[0] for _, name in PHASES) + " |")
    lines.append("|---|---|" + "---|" * len(PHASES))
    for cls, by_path in summary.items():
        for path in PATHS:
            e = by_path.get(path)
            if e:
                cells = " | ".join(_f(e["phases_p50"].get(k)) for k, _ in PHASES)
                lines.append(f"| {cls} | {path} | {cells} |")
    lines += [""] + [
        f"- **{name.split(' (')[0]}**: {name.split(' (', 1)[1].rstrip(')')}"
        for _, name in PHASES
        if " (" in name
    ]
    lines += [
        "",
        "### Spare vs requeue (done-when: first step p50 ≤ 8 s, at most half the requeue's)",
        "",
        "| class | spare first step p50 (s) | requeue (s) | ratio | ≤ 8 s | ≤ half |",
        "|---|---|---|---|---|---|",
    ]
    for cls, by_path in summary.items():
        sp, rq = by_path.get("spare"), by_path.get("requeue")
        if not sp or not rq:
            continue
        a, b = sp["fault_to_first_step_p50"], rq["fault_to_first_step_p50"]
        ratio = a / b if a is not None and b else None
        lines.append(
            f"| {cls} | {_f(a)} | {_f(b)} | {_f(ratio)} | "
            f"{'yes' if a is not None and a <= 8 else 'no'} | "
            f"{'yes' if ratio is not None and ratio <= 0.5 else 'no'} |"
        )
    lines += [
        "",
        f"### Goodput: a {GPUS:,}-GPU job, {INTERRUPTIONS} interruptions in {DAYS} days (Llama 3)",
        "",
        "Effective training time ratio (ETTR) = 1 − badput / wall time, every interruption "
        "stopping the whole job (so the GPU count enters only through the interruption rate). "
        "Each interruption costs the path's measured phases, weighted over the classes by Mix A "
        f"({', '.join(f'{c} {w:g}' for c, w in WEIGHTS.items())}), plus half a "
        f"{good['checkpoint_interval_min']:g}-minute checkpoint interval of lost progress. "
        "Slurm alone: the job fails and waits for a person "
        f"({good['human_response_min']:g} min, an assumption), then comes back as a requeue "
        "does. Categories are ml-goodput-measurement's BadputType; TPU_INITIALIZATION, "
        "TRAINING_PREP, DATA_LOADING_*, UNPRODUCTIVE_CHECKPOINT_SAVE_TIME, "
        "CUSTOM_BADPUT_EVENTS and OTHER are not modelled (the same on every path).",
        "",
        "| path | downtime / interruption (s) | infrastructure recovery | program startup | "
        "checkpoint restore | wasted progress | ETTR | ETTR without the lost progress |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for path, g in good["paths"].items():
        b = g["badput_s_per_interruption"]
        lines.append(
            f"| {path} | {g['downtime_per_interruption_s']:.1f} | "
            f"{b['INFRASTRUCTURE_RECOVERY_FROM_DISRUPTION']:.1f} | {b['PROGRAM_STARTUP']:.1f} | "
            f"{b['UNPRODUCTIVE_CHECKPOINT_RESTORE_TIME']:.1f} | "
            f"{b['WASTED_PROGRESS_FROM_DISRUPTION']:.0f} | "
            f"{100 * g['effective_training_time_ratio']:.2f} % | "
            f"{100 * g['ettr_restart_only']:.3f} % |"
        )
    lines += [
        "",
        "At this interruption rate a restart path's own seconds are small beside the progress "
        "lost since the last checkpoint and, above all, beside a person's response: the last "
        "column leaves the lost progress out, to show the paths' own difference.",
    ]
    return "\n".join(lines) + "\n"


def _f(v: float | None) -> str:
    return "–" if v is None else f"{v:.2f}" if v < 10 else f"{v:.1f}"


def write(
    results: Path, rows: list[dict[str, Any]], summary: dict[str, Any], meta: dict[str, Any],
    *, ckpt_interval_min: float, human_response_min: float,
) -> str:  # fmt: skip
    """restart.md, summary.json and restart-raw.json under ``results``; the section replaced
    (or added) in REPORT.md there when it exists. Returns the section."""
    good = goodput(
        summary, ckpt_interval_min=ckpt_interval_min, human_response_min=human_response_min
    )
    section = render(summary, good, meta)
    results.mkdir(parents=True, exist_ok=True)
    (results / "restart.md").write_text(section[1:])  # its "##" title as the page's "#"
    slim = {
        "generated_at": meta.get("when"),
        "restart_paths": [p for p in PATHS if any(p in v for v in summary.values())],
        "classes": {
            cls: {p: {k: e[k] for k in SUMMARY_KEYS} for p, e in by.items()}
            for cls, by in summary.items()
        },
        "phases_p50": {
            cls: {p: e["phases_p50"] for p, e in by.items()} for cls, by in summary.items()
        },
        "goodput": good,
    }
    (results / "summary.json").write_text(json.dumps(slim, indent=2) + "\n")
    (results / "restart-raw.json").write_text(json.dumps({"rows": rows, "meta": meta}, indent=1))
    report = results / "REPORT.md"
    if report.exists():
        text = report.read_text()
        block = f"{MARK}\n{section}{END}\n"
        if MARK in text and END in text:
            pattern = re.escape(MARK) + r".*?" + re.escape(END) + r"\n?"
            text = re.sub(pattern, lambda _: block, text, flags=re.S)
        else:
            text = text.rstrip("\n") + "\n\n" + block
        report.write_text(text)
    return section
