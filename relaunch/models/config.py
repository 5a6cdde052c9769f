"""Per-cluster configuration: how to reach Slurm, where logs are, what to watch, and policy."""

from __future__ import annotations

from pydantic import BaseModel, Field

from relaunch.models.logstore import LogStoreSettings
from relaunch.models.recovery import Policy


class WatchSettings(BaseModel):
    partitions: list[str] = Field(default_factory=list, description="watch every job here")
    opt_in_comment: bool = True
    poll_interval_s: float = Field(default=1.0, gt=0, le=2.0)
    log_interval_s: float = Field(
        default=0.25, gt=0, le=2.0, description="how often watched logs are read between polls"
    )
    hang_threshold_s: float = 120.0
    progress_pattern: str | None = None


class ClusterConfig(BaseModel):
    """One cluster Relaunch serves. Written by `relaunch dev up` for the local stack."""

    name: str
    slurm_conf: str | None = None
    temporal_address: str = "127.0.0.1:7233"
    temporal_namespace: str = "default"
    temporal_ui: str = "http://127.0.0.1:8233"
    database_url: str
    bundle_dir: str
    node_log_pattern: str | None = Field(
        default=None, description="per-node kernel-log source, e.g. /var/log/nodes/{node}/kern.log"
    )
    telemetry_pattern: str | None = Field(
        default=None,
        description="where `relaunch agent --output` writes each node's telemetry.jsonl, "
        "e.g. /shared/relaunch/{node}/telemetry.jsonl",
    )
    logs: LogStoreSettings = Field(
        default_factory=LogStoreSettings,
        description="job and kernel logs: files, Loki, VictoriaLogs",
    )
    policy: Policy = Field(default_factory=Policy)
    watch: WatchSettings = Field(default_factory=WatchSettings)

    @property
    def slurm_env(self) -> dict[str, str]:
        return {"SLURM_CONF": self.slurm_conf} if self.slurm_conf else {}
