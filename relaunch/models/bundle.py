"""The incident bundle: everything known about one interruption (the design's format).

A directory holding ``job.json``, ``logs/job.log``, optional ``nodes/<node>.log``, optional
``telemetry.jsonl`` and optional ``health.jsonl`` / ``health-untrusted.jsonl`` (node-health events
other systems pushed in). `gather_evidence` writes it, `relaunch classify` and attribution read it.
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum

from pydantic import BaseModel, Field


class BundleJob(BaseModel):
    """``job.json``."""

    cluster: str
    job_id: str
    state: str
    exit_code: str = "0:0"
    reason: str = ""
    nodes: list[str] = Field(default_factory=list)
    node_states: dict[str, str] = Field(default_factory=dict)
    ranks: dict[str, str] | None = None
    observed_at: datetime
    last_progress_at: datetime | None = None
    # Additive fields Relaunch itself records; readers must not require them.
    unreachable_nodes: list[str] = Field(default_factory=list)
    detections: list[str] = Field(default_factory=list)
    submit_time: datetime | None = Field(
        default=None, description="a job line stamped before this (or in the future) is ignored"
    )
    user: str = Field(default="", description="the job's owner (cross-user corroboration)")
    progress_step: int | None = Field(
        default=None,
        description="the highest training step the attempt's progress lines reached (the job's "
        "own words; None when it printed none): with no stall measured, its ranks advance",
    )
    refused_paths: dict[str, str] = Field(
        default_factory=dict,
        description="job output files not read (path → why: not a regular file, a symbolic "
        "link, outside the allowed roots, or not readable by the job's user)",
    )

    def rank_node(self, rank: int) -> str | None:
        """The node a rank ran on: the explicit map, else one task per node in order."""
        if self.ranks is not None:
            return self.ranks.get(str(rank))
        if 0 <= rank < len(self.nodes):
            return self.nodes[rank]
        return None


class TelemetrySource(StrEnum):
    """Where a telemetry sample was read."""

    NVML = "nvml"
    DCGM = "dcgm"
    KERNEL = "kernel"


class TelemetrySample(BaseModel):
    """One reading for one GPU of one node (``gpu`` is None for a node-level kernel line).

    A line of ``telemetry.jsonl``. Only ``node`` is required; every other field is absent when
    its source does not report it (a GPU without row remapping, a kernel line without a GPU).
    Counters are totals as the source reports them, not deltas.
    """

    node: str
    gpu: int | None = None
    time: datetime | None = None
    xid: int | None = None
    ecc_dbe_volatile: int | None = None
    # Additive fields (the node agent, dcgm-exporter, the kernel log); readers must not
    # require them.
    source: TelemetrySource | None = None
    pci_bus_id: str | None = None
    uuid: str | None = None
    ecc_dbe_aggregate: int | None = None
    remapped_rows_correctable: int | None = None
    remapped_rows_uncorrectable: int | None = None
    remapped_rows_pending: bool | None = None
    remapped_rows_failure: bool | None = None
    retired_pages_dbe: int | None = None
    retired_pages_pending: bool | None = None
    nvlink_errors: int | None = Field(
        default=None, description="replay + recovery + CRC (flit and data) errors, all links"
    )
    throttle: list[str] | None = Field(
        default=None,
        description="active slowdown reasons: hw_slowdown, hw_thermal, sw_thermal, "
        "hw_power_brake, sw_power_cap",
    )
    errors: list[str] | None = Field(
        default=None, description="reads that failed or hung (a hung NVML call is a symptom)"
    )
    signature: str | None = Field(default=None, description="catalogue id of a kernel line")
    message: str | None = Field(default=None, description="the kernel line, as printed")


# The files of a bundle's health events: the file, not the line, says whether its sender may
# convict a node (docs/trust.md).
HEALTH_FILE = "health.jsonl"
UNTRUSTED_HEALTH_FILE = "health-untrusted.jsonl"


class HealthReport(BaseModel):
    """A node-health event another system pushed in (``POST /intake/health``: NVSentinel's
    HealthEvent or the generic shape), as the console read it; one line of a bundle's
    ``health.jsonl`` (senders whose token is trusted with health events) or
    ``health-untrusted.jsonl`` (the others). Every field is bounded by the intake's parsing
    (relaunch/models/intake.py)."""

    node: str
    time: datetime | None = Field(default=None, description="when the sender says it happened")
    component: str = Field(default="", description="GPU, NVSWITCH, NIC, CPU, ... as sent")
    check: str = Field(default="", description="the sender's check (NVSentinel's checkName)")
    error_codes: list[str] = Field(default_factory=list, description="e.g. ['79'] for an Xid")
    recommended_action: str = Field(
        default="NONE", description="NVSentinel's RecommendedAction name: RESTART_BM, ..."
    )
    is_fatal: bool = False
    is_healthy: bool = False
    message: str = ""
    journal: str = Field(
        default="",
        description="the kernel line the sender read, where it says (NVSentinel's "
        "metadata JOURNAL_MESSAGE)",
    )
    entities: list[str] = Field(
        default_factory=list, description="what it impacts, TYPE:value (PCI:0000:17:00.0)"
    )
    source: str = Field(default="", description="the sending system and agent, as it says")
    sender: str = Field(default="", description="the name of the console token that sent it")
    trusted: bool = Field(
        default=False, description="the token is trusted with health events: the event convicts"
    )


class Bundle(BaseModel):
    """A loaded bundle, held in memory for attribution."""

    path: str
    job: BundleJob
    job_log: str = Field(
        default="",
        description="the job's log; for a log read from disk larger than the inline limit, "
        "only its end (the whole log is at job_log_file)",
    )
    # Additive: a big log stays on disk and is scanned from there in chunks.
    job_log_file: str | None = Field(
        default=None, description="the job log on disk, when job_log holds only its end"
    )
    node_logs: dict[str, str] = Field(default_factory=dict)
    telemetry: list[TelemetrySample] = Field(default_factory=list)
    health: list[HealthReport] = Field(default_factory=list)
