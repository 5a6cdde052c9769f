"""The Xid table: NVIDIA's Xid catalogue as data (``table.json``, ``nvlink5.json``).

One row per Xid code the catalogue lists (1–172 in the December 2026 revision): the mnemonic,
the catalogue's short description, the GPUs it applies to, its *immediate action* (the
resolution bucket NVIDIA intends as the automatable recovery) and investigatory action, and
what the code implicates. Where Relaunch acts otherwise, or the catalogue leaves the cell blank,
the row says so (``relaunch`` and ``why``); docs/xid-catalogue.md lists those rows.

A bucket says what to do; :data:`OUTCOMES` says what that means here: a reset, a reboot or a
support call takes the node out (drain), a restart of the application does not, an ignored code
never explains an interruption. Three buckets need the line itself (decode.py): Xid 74's
registers, Xid 144–150's interrupt info and error status, Xid 154's recovery action.
"""

from __future__ import annotations

import functools
import json
from enum import StrEnum
from importlib import resources

from pydantic import BaseModel, ConfigDict, Field, model_validator


class Bucket(StrEnum):
    """A resolution bucket of the catalogue (the immediate-action column), plus TEARDOWN:
    Relaunch's reading of Xid 45's workflow (an aftermath, never a cause)."""

    RESTART_APP = "RESTART_APP"
    IGNORE = "IGNORE"
    RESET_GPU = "RESET_GPU"
    RESTART_BM = "RESTART_BM"
    RESTART_VM = "RESTART_VM"
    CONTACT_SUPPORT = "CONTACT_SUPPORT"
    CHECK_MECHANICALS = "CHECK_MECHANICALS"
    UPDATE_SWFW = "UPDATE_SWFW"
    CHECK_UVM = "CHECK_UVM"
    WORKFLOW_XID_45 = "WORKFLOW_XID_45"
    WORKFLOW_XID_48 = "WORKFLOW_XID_48"
    WORKFLOW_NVLINK_ERR = "WORKFLOW_NVLINK_ERR"
    WORKFLOW_NVLINK5_ERR = "WORKFLOW_NVLINK5_ERR"
    XID_154 = "XID_154"
    XID_154_EVAL = "XID_154_EVAL"
    TEARDOWN = "TEARDOWN"
    BLANK = ""


class Outcome(StrEnum):
    """What a (decoded) bucket means for a recovery."""

    DRAIN = "drain"  # the node's GPU needs a reset, a reboot or a person: take the node out
    RESTART = "restart"  # restart the application; isolate nothing
    FOLLOW_154 = "follow_154"  # an Xid 154 on the same GPU decides; without one, RESTART
    CONTEXT = "context"  # no action: never explains an interruption
    TEARDOWN = "teardown"  # the aftermath of another error or of the job's end


class Remedy(StrEnum):
    """The rung of the remediation ladder a drained node's GPU needs, cheapest first."""

    GPU_RESET = "gpu_reset"
    REBOOT = "reboot"
    ESCALATE = "escalate"


class Implicates(StrEnum):
    """Where the catalogue places the fault a code reports."""

    GPU = "gpu"
    NODE = "node"  # beyond the GPU: its PCIe link, power, the machine's software
    APPLICATION = "application"
    NONE = "none"  # driver or test events that are nobody's fault


# Every bucket a decoded line can end in, and what it means. WORKFLOW_NVLINK_ERR,
# WORKFLOW_NVLINK5_ERR and XID_154 are never final: decode.py resolves them from the line.
OUTCOMES: dict[Bucket, tuple[Outcome, Remedy | None]] = {
    Bucket.RESET_GPU: (Outcome.DRAIN, Remedy.GPU_RESET),
    Bucket.WORKFLOW_XID_48: (Outcome.DRAIN, Remedy.GPU_RESET),
    Bucket.RESTART_BM: (Outcome.DRAIN, Remedy.REBOOT),
    Bucket.RESTART_VM: (Outcome.DRAIN, Remedy.REBOOT),
    Bucket.CONTACT_SUPPORT: (Outcome.DRAIN, Remedy.ESCALATE),
    Bucket.CHECK_MECHANICALS: (Outcome.DRAIN, Remedy.ESCALATE),
    Bucket.UPDATE_SWFW: (Outcome.DRAIN, Remedy.ESCALATE),
    Bucket.RESTART_APP: (Outcome.RESTART, None),
    Bucket.XID_154_EVAL: (Outcome.FOLLOW_154, None),
    Bucket.IGNORE: (Outcome.CONTEXT, None),
    Bucket.CHECK_UVM: (Outcome.CONTEXT, None),
    Bucket.TEARDOWN: (Outcome.TEARDOWN, None),
    Bucket.WORKFLOW_XID_45: (Outcome.TEARDOWN, None),
}
DECODED = frozenset({Bucket.WORKFLOW_NVLINK_ERR, Bucket.WORKFLOW_NVLINK5_ERR, Bucket.XID_154})


class XidRow(BaseModel):
    """One code of the catalogue."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    code: int = Field(ge=1)
    mnemonic: str = Field(min_length=1)
    words: str = Field(min_length=1, description="the catalogue's short description")
    applies_to: list[str]
    immediate: Bucket = Field(description="the catalogue's immediate action (blank: none given)")
    investigatory: str
    implicates: Implicates
    relaunch: Bucket | None = Field(
        default=None, description="the bucket Relaunch uses instead of `immediate`"
    )
    why: str = ""
    repeats_convict: int | None = Field(
        default=None, ge=2, description="this many on one GPU within a day make it the GPU's"
    )
    note: str = ""

    @property
    def action(self) -> Bucket:
        """The bucket Relaunch follows (before any decode of the line)."""
        return self.relaunch or self.immediate

    @model_validator(mode="after")
    def _has_an_action(self) -> XidRow:
        if self.action is Bucket.BLANK:
            raise ValueError(f"Xid {self.code}: blank immediate action and no `relaunch` bucket")
        if self.action not in OUTCOMES and self.action not in DECODED:
            raise ValueError(f"Xid {self.code}: bucket {self.action.value} has no meaning here")
        if self.relaunch is not None and not self.why:
            raise ValueError(f"Xid {self.code}: a `relaunch` bucket needs its `why`")
        return self


class XidTableFile(BaseModel):
    """The shape of ``table.json``."""

    model_config = ConfigDict(extra="forbid")

    description: str
    version: int
    codes: list[XidRow]

    @model_validator(mode="after")
    def _unique(self) -> XidTableFile:
        codes = [r.code for r in self.codes]
        if len(set(codes)) != len(codes):
            raise ValueError("duplicate Xid codes")
        return self


class Nvl5Unit(BaseModel):
    """One unit of the NVLink5 decode sheet (Xid 144–150)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    xid: int = Field(ge=144, le=150)
    names: list[str] = Field(min_length=1)
    v1: str = Field(pattern=r"^[01]{10}$", description="intrInfo bits 9..0 before R575")
    v2: str = Field(pattern=r"^[01]{7}$", description="intrInfo bits 6..0 from R575")
    reason: str = Field(default="000000", pattern=r"^[01]{6}$")
    status: dict[str, Bucket] = Field(default_factory=dict)
    reasons: dict[str, Bucket] = Field(default_factory=dict)
    any: Bucket | None = None
    promote: list[str] = Field(default_factory=list)
    promoted: Bucket | None = None

    @model_validator(mode="after")
    def _one_rule(self) -> Nvl5Unit:
        if sum(bool(x) for x in (self.status, self.reasons, self.any)) != 1:
            raise ValueError(f"{self.names}: exactly one of status, reasons, any")
        actions = [*self.status.values(), *self.reasons.values(), self.any, self.promoted]
        if any(a is not None and a not in OUTCOMES for a in actions):
            raise ValueError(f"{self.names}: an action with no meaning here")
        if bool(self.promote) != (self.promoted is not None):
            raise ValueError(f"{self.names}: promote and promoted go together")
        return self


class Nvl5File(BaseModel):
    model_config = ConfigDict(extra="forbid")

    description: str
    version: int
    units: list[Nvl5Unit]


class XidTable:
    """The loaded table. Build it with :func:`xid_table` (loaded once per process)."""

    def __init__(self, rows: list[XidRow], units: list[Nvl5Unit]) -> None:
        self.rows = {r.code: r for r in rows}
        self.units = units

    def row(self, code: int) -> XidRow | None:
        return self.rows.get(code)

    @property
    def highest(self) -> int:
        return max(self.rows)


@functools.cache
def xid_table() -> XidTable:
    """The packaged table."""
    here = resources.files("relaunch.detection.xids")
    table = XidTableFile.model_validate(json.loads(here.joinpath("table.json").read_text("utf-8")))
    nvl5 = Nvl5File.model_validate(json.loads(here.joinpath("nvlink5.json").read_text("utf-8")))
    return XidTable(table.codes, nvl5.units)
