"""GPU faults read the way NVIDIA's Xid catalogue reads them.

:func:`judge` takes an Xid code and the rest of its line and says what the catalogue would do:
the bucket (after the decodes of Xid 74, 144–150 and 154), what that means for a recovery
(drain, restart, no action, aftermath), the remediation rung, and the catalogue's words. The
table is data (``table.json``, ``nvlink5.json``); docs/xid-catalogue.md explains it.
"""

from __future__ import annotations

from dataclasses import dataclass

from relaunch.detection.xids.decode import decode_nvlink5, decode_xid74, decode_xid154
from relaunch.detection.xids.table import (
    DECODED,
    OUTCOMES,
    Bucket,
    Implicates,
    Outcome,
    Remedy,
    XidRow,
    XidTable,
    xid_table,
)

__all__ = [
    "OUTCOMES",
    "Bucket",
    "Implicates",
    "Outcome",
    "Remedy",
    "XidJudgement",
    "XidRow",
    "XidTable",
    "judge",
    "reads_the_line",
    "xid_table",
]


@dataclass(frozen=True)
class XidJudgement:
    """What one Xid line means."""

    code: int
    action: Bucket  # the bucket followed, after decoding the line (BLANK: not in the table)
    outcome: Outcome
    remedy: Remedy | None  # for a drain: the rung the GPU or node needs
    words: str  # the catalogue's short description of the code
    detail: str  # how the action was reached
    implicates: Implicates

    @property
    def drains(self) -> bool:
        return self.outcome is Outcome.DRAIN


def reads_the_line(code: int) -> bool:
    """Whether the judgement on ``code`` depends on the rest of its line (Xid 74, 144–150,
    154), rather than on the code alone."""
    row = xid_table().row(code)
    return row is not None and row.action in DECODED


def judge(code: int, rest: str = "", table: XidTable | None = None) -> XidJudgement:
    """The judgement on Xid ``code``; ``rest`` is the line after the code (where the decodes
    read registers and recovery actions). A code the catalogue does not list restarts the
    application and isolates nothing: it is hardware evidence of unknown weight."""
    table = table or xid_table()
    row = table.row(code)
    if row is None:
        return XidJudgement(
            code,
            Bucket.BLANK,
            Outcome.RESTART,
            None,
            "not in NVIDIA's Xid catalogue",
            f"Xid {code} is not in the catalogue (codes 1–{table.highest}): restart, "
            "isolate nothing",
            Implicates.GPU,
        )
    bucket = row.action
    if bucket is Bucket.WORKFLOW_NVLINK_ERR:
        bucket, detail = decode_xid74(rest)
    elif bucket is Bucket.WORKFLOW_NVLINK5_ERR:
        bucket, detail = decode_nvlink5(code, rest, table.units)
    elif bucket is Bucket.XID_154:
        bucket, detail = decode_xid154(rest)
    elif row.relaunch is not None:
        shown = row.immediate.value or "blank"
        detail = f"catalogue: {shown}; Relaunch: {bucket.value}, {row.why}"
    else:
        detail = f"immediate action {bucket.value}"
    outcome, remedy = OUTCOMES[bucket]
    return XidJudgement(code, bucket, outcome, remedy, row.words, detail, row.implicates)
