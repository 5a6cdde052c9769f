"""How often Relaunch's verdict agrees with NVIDIA's Xid catalogue on drain vs no drain.

One bundle per Xid code (1-172) and per documented decode variant (every row of the Xid 144-150
decode sheet in both intrInfo layouts, every Xid 154 recovery action, a set of Xid 74 register
patterns): the Xid is the only fault, on one node's kernel log, and the job failed. The full
attribution engine decides; the verdict drains when its action is isolate_and_restart. NVIDIA's
side is the catalogue's immediate action: a GPU reset, reboot, VM restart, support call,
mechanical check or software update takes the GPU out; restarting the application or ignoring
does not; blank cells have no answer, nor have the conditional ones (CHECK_UVM: reset where
UVM/vGPU is in use; WORKFLOW_XID_45: alone, restart the fabric manager; with others, follow them).

Writes bench/results/xid_agreement.md. Usage: python bench/xid_agreement.py
"""

from __future__ import annotations

import platform
import time
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

from relaunch.detection.attribution import attribute_bundle
from relaunch.detection.xids import Bucket, xid_table
from relaunch.models.bundle import Bundle, BundleJob
from relaunch.models.recovery import Action

OUT = Path(__file__).parent / "results" / "xid_agreement.md"
NVIDIA_DRAINS = {
    Bucket.RESET_GPU,
    Bucket.RESTART_BM,
    Bucket.RESTART_VM,
    Bucket.CONTACT_SUPPORT,
    Bucket.CHECK_MECHANICALS,
    Bucket.UPDATE_SWFW,
    Bucket.WORKFLOW_XID_48,
}
NVIDIA_KEEPS = {Bucket.RESTART_APP, Bucket.IGNORE, Bucket.XID_154_EVAL}
NODES = ["n1", "n2", "n3"]
T0 = datetime(2026, 12, 3, 9, 0, tzinfo=UTC)
NVL5 = "{unit} {sev} XC0 i0 Link 10 ({intr:#010x} {status:#010x} 0x0 0x0 0x0 0x0)"
RECOVERY = {0: "None", 1: "GPU Reset Required", 2: "Node Reboot Required", 3: "Drain P2P",
            4: "Drain and Reset"}  # fmt: skip
XID74 = {  # registers → the catalogue's reading (drain unless only ignorable bits are set)
    "0x0, 0x0, 0x10000, 0x0, 0x0, 0x0, 0x0": Bucket.RESET_GPU,
    "0x10, 0x0, 0x0, 0x0, 0x0, 0x0, 0x0": Bucket.RESET_GPU,
    "0x200000, 0x0, 0x0, 0x0, 0x0, 0x0, 0x0": Bucket.RESET_GPU,
    "0x0, 0x0, 0x0, 0x40000, 0x0, 0x0, 0x0": Bucket.RESET_GPU,
    "0x1, 0x0, 0x0, 0x0, 0x0, 0x0, 0x0": Bucket.IGNORE,
    "0x0, 0x0, 0x0, 0x0, 0x800000, 0x0, 0x0": Bucket.IGNORE,
}


def verdict_drains(rest: str, code: int) -> bool:
    line = f"2026-12-03T09:04:00+00:00 n2 kernel: NVRM: Xid (PCI:0000:3b:00): {code}, {rest}"
    job = BundleJob(
        cluster="c",
        job_id="77",
        state="FAILED",
        nodes=NODES,
        node_states=dict.fromkeys(NODES, "ALLOCATED"),
        observed_at=T0.replace(minute=5),
        submit_time=T0,
    )
    bundle = Bundle(
        path="mem",
        job=job,
        job_log="srun: error: n2: task 1: Exited with exit code 1\n",
        node_logs={"n2": line + "\n"},
    )
    v = attribute_bundle(bundle)
    return v.action is Action.ISOLATE_AND_RESTART and v.culprit_nodes == ["n2"]


def cases() -> list[tuple[str, int, str, Bucket]]:
    """(label, code, rest of the line, NVIDIA's bucket for it)."""
    table = xid_table()
    out = []
    for code, row in sorted(table.rows.items()):
        if row.immediate in (
            Bucket.WORKFLOW_NVLINK_ERR,
            Bucket.WORKFLOW_NVLINK5_ERR,
            Bucket.XID_154,
        ):
            continue
        out.append((f"Xid {code}", code, "pid=1, name=python3, an event", row.immediate))
    for regs, bucket in XID74.items():
        rest = f"NVLink: fatal error detected on link 14({regs})"
        out.append((f"Xid 74 ({regs.split(',')[0]}…)", 74, rest, bucket))
    for value, name in RECOVERY.items():
        rest = f"GPU recovery action changed from 0x0 (None) to {value:#x} ({name})"
        nvidia = {0: Bucket.IGNORE, 2: Bucket.RESTART_BM}.get(value, Bucket.RESET_GPU)
        out.append((f"Xid 154 → {name}", 154, rest, nvidia))
    for unit in table.units:
        layouts = (("v1", int(unit.v1, 2)), ("v2", int(unit.v2, 2)))
        rows: list[tuple[int, int, Bucket]] = []
        if unit.any is not None:
            rows += [(0, 0, unit.any)]
        rows += [(int(r, 2) << 20, 0, b) for r, b in unit.reasons.items()]
        rows += [(0, int(s, 16), b) for s, b in unit.status.items()]
        for layout, bits in layouts:
            for extra, status, bucket in rows:
                rest = NVL5.format(unit=unit.names[-1], sev="Nonfatal", intr=bits | extra,
                                   status=status)  # fmt: skip
                label = f"Xid {unit.xid} {unit.names[-1]} {layout} status {status:#x}"
                out.append((label, unit.xid, rest, bucket))
    return out


def main() -> None:
    started = time.perf_counter()
    tally: Counter[str] = Counter()
    per_bucket: Counter[tuple[str, str]] = Counter()
    differ: list[str] = []
    for label, code, rest, bucket in cases():
        drains = verdict_drains(rest, code)
        ours = "drain" if drains else "no drain"
        per_bucket[(bucket.value or "blank", ours)] += 1
        if bucket in NVIDIA_DRAINS or bucket in NVIDIA_KEEPS:
            agree = drains is (bucket in NVIDIA_DRAINS)
            tally["agree" if agree else "differ"] += 1
            if not agree:
                differ.append(f"{label}: NVIDIA {bucket.value}, Relaunch {ours}")
        else:
            tally["no catalogue answer"] += 1
    elapsed = time.perf_counter() - started
    total = tally["agree"] + tally["differ"]
    lines = [
        "# Xid agreement with NVIDIA's Xid catalogue",
        "",
        f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC · Python {platform.python_version()} · "
        "`python bench/xid_agreement.py`",
        "",
        f"- cases: {sum(tally.values())} (172 codes less the 9 decoded ones, "
        "6 Xid 74 register patterns, 5 Xid 154 recovery actions, every Xid 144-150 decode row "
        "in both intrInfo layouts); one bundle each through the full attribution engine",
        f"- agree on drain vs no drain: **{tally['agree']} of {total}**"
        f" ({100 * tally['agree'] / max(total, 1):.1f}%)",
        f"- no answer in the catalogue (blank cell, or CHECK_UVM's condition): "
        f"{tally['no catalogue answer']} (Relaunch's choices: docs/xid-catalogue.md)",
        f"- {elapsed:.1f} s",
        "",
        "| NVIDIA's immediate action | Relaunch drains | Relaunch does not drain |",
        "|---|---|---|",
    ]
    for bucket in sorted({b for b, _ in per_bucket}):
        lines.append(
            f"| {bucket} | {per_bucket[(bucket, 'drain')]} | {per_bucket[(bucket, 'no drain')]} |"
        )
    lines += ["", "Differences:", ""] + ([f"- {d}" for d in differ] or ["- none"])
    OUT.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
