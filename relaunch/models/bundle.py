"""The incident bundle: everything known about one interruption (the design's format).

A directory holding ``job.json``, ``logs/job.log``, optional ``nodes/<node>.log`` and optional
``telemetry.jsonl``. `gather_evidence` writes it, `relaunch classify` and attribution read it.
"""

from __future__ import annotations

from datetime import datetime

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

    def rank_node(self, rank: int) -> str | None:
        """The node a rank ran on: the explicit map, else one task per node in order."""
        if self.ranks is not None:
            return self.ranks.get(str(rank))
        if 0 <= rank < len(self.nodes):
            return self.nodes[rank]
        return None


class TelemetrySample(BaseModel):
    node: str
    gpu: int | None = None
    time: datetime | None = None
    xid: int | None = None
    ecc_dbe_volatile: int | None = None


class Bundle(BaseModel):
    """A loaded bundle, held in memory for attribution."""

    path: str
    job: BundleJob
    job_log: str = ""
    node_logs: dict[str, str] = Field(default_factory=dict)
    telemetry: list[TelemetrySample] = Field(default_factory=list)
