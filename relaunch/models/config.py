"""Per-cluster configuration: how to reach Slurm, where logs are, what to watch, and policy."""

from __future__ import annotations

import os
import re
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from relaunch.models import names
from relaunch.models.endpoints import SlurmRestSettings, TemporalTlsSettings
from relaunch.models.lifecycle import LifecycleSettings
from relaunch.models.logstore import LogStoreSettings
from relaunch.models.notify import NotifySettings
from relaunch.models.recovery import Policy
from relaunch.models.rollout import RolloutSettings
from relaunch.models.tracing import TracingSettings


class ProbeMethod(StrEnum):
    """How the watcher asks a node's slurmd whether the node is alive."""

    AUTO = "auto"  # from the `ssh` host when set; else syn when permitted, else connect
    SYN = "syn"  # a raw-socket SYN: a half-open handshake, nothing reaches slurmd
    CONNECT = "connect"  # a plain TCP connect, closed at once


# Why the hang floor is 45 s: a silently hung job must be seen within 60 s (the floor plus a
# poll), while the pauses a healthy job makes without printing progress must not alarm: a 30 s
# evaluation pass and a 20 s checkpoint save leave a margin of 15 s (a save followed by an
# evaluation is two pauses: a finished save ends the first; bench/results/false_alarms.md). A
# job that pauses longer says so with `--comment relaunch=on,hang_after=10m`; once it has
# paused, 1.5 x its longest pause is its floor anyway.
HANG_FLOOR_WHY = (
    "a whole-job stall is reported after max(this, stall_k x the median step interval, 1.5 x "
    "the longest pause already seen); 45 s sees a silent hang within 60 s while a 30 s "
    "evaluation pause or a 20 s checkpoint save does not alarm; a job's comment "
    "`hang_after=<seconds, or 10m, 2h>` replaces it for that job"
)
LAG_FLOOR_WHY = (
    "a rank that stops while its peers go on is reported after max(this, stall_k x the "
    "job's median step interval); a job's comment `lag_after=<duration>` replaces it"
)


# Every section of a cluster's configuration refuses a key it does not know: a misspelt
# `watch.partitons` or `policy.mdoe` is an error naming it, never a silently dropped setting.
STRICT = ConfigDict(extra="forbid")


class WatchPaces(BaseModel):
    """How often the watcher reads what (relaunch/workers/watch_cadence.py, docs/scale.md): the
    configuration's ``watch`` section and the watcher's own settings share these."""

    poll_interval_s: float = Field(
        default=1.0,
        gt=0,
        le=60,
        description="the shortest time between two listings of the jobs (or of the nodes); "
        "how often they come follows their cost and what happens (docs/scale.md)",
    )
    listing_share: float = Field(
        default=0.02,
        gt=0,
        le=1,
        description="while nothing happens, at most this share of the time goes to listing "
        "every job (the active ones are listed every active_interval_s between): a listing "
        "that takes 0.7 s (10,000 jobs) runs every 30 s (reconcile_s) (docs/scale.md)",
    )
    listing_share_busy: float = Field(
        default=0.25,
        gt=0,
        le=1,
        description="the same share for busy_s after a detection, while recoveries run",
    )
    reconcile_s: float = Field(
        default=30.0,
        ge=1,
        le=300,
        description="a full job listing at least this often, however long it takes",
    )
    active_interval_s: float = Field(
        default=2.0,
        gt=0,
        le=60,
        description="between full listings, how often the jobs in any state but pending are "
        "listed (poll_interval_s while busy): a job that starts is watched within this long",
    )
    node_interval_s: float = Field(
        default=5.0,
        gt=0,
        le=300,
        description="how often the nodes are listed while watched jobs run and nothing happens "
        "(poll_interval_s while busy or while a recovery waits to see its node drained)",
    )
    busy_s: float = Field(
        default=60.0, ge=0, le=3600, description="how long a detection keeps the watcher busy"
    )
    log_quiet_max_s: float = Field(
        default=1.0,
        gt=0,
        le=10,
        description="a watched log that did not grow is read less often, backing off from "
        "log_interval_s to at most this (docs/detection.md, 'Logs read by need')",
    )

    @model_validator(mode="after")
    def _paces_in_order(self) -> WatchPaces:
        if self.poll_interval_s > self.reconcile_s:
            raise ValueError(
                f"watch.poll_interval_s ({self.poll_interval_s:g}) is above watch.reconcile_s "
                f"({self.reconcile_s:g}): the shortest interval between listings cannot be "
                "longer than the longest"
            )
        return self


class WatchSettings(WatchPaces):
    model_config = STRICT

    partitions: list[str] = Field(default_factory=list, description="watch every job here")
    opt_in_comment: bool = True
    log_interval_s: float = Field(
        default=0.25, gt=0, le=2.0, description="how often watched logs are read between polls"
    )
    hang_threshold_s: float = Field(default=45.0, ge=5, le=7 * 86400, description=HANG_FLOOR_WHY)
    lag_floor_s: float = Field(default=5.0, ge=1, le=7 * 86400, description=LAG_FLOOR_WHY)
    progress_pattern: str | None = None
    follow_up_hold_s: float = Field(
        default=10.0,
        ge=0,
        le=60,
        description="later signs of an interruption already handed over to its recovery are "
        "held this long and handed over together, in one signal (0: each at once)",
    )
    probe_interval_s: float = Field(
        default=1.0, ge=0.1, le=60, description="between liveness probes of a running job's nodes"
    )
    probe_timeout_s: float = Field(
        default=1.0, gt=0, le=30, description="a probe unanswered this long counts as failed"
    )
    probe_failures: int = Field(
        default=3,
        ge=1,
        le=100,
        description="consecutive failed probes that make a node unreachable (one lost packet "
        "is not a dead node); detection takes about failures x interval",
    )
    probe_method: ProbeMethod = Field(
        default=ProbeMethod.AUTO, description="auto, syn or connect (see ProbeMethod)"
    )
    probe_enabled: bool = Field(
        default=True, description="probe the slurmd of every node a watched job runs on"
    )
    heartbeat_timeout_s: float = Field(
        default=15.0,
        ge=1,
        le=3600,
        description="a node whose agent (`relaunch agent --heartbeat`, 5 s by default) sent a "
        "heartbeat and then none for this long is reported; three missed beats",
    )
    catch_up_window_s: float = Field(
        default=4 * 3600.0,
        ge=0,
        le=7 * 86400,
        description="after the watcher was down (or could not list jobs), job ends it missed "
        "are read from Slurm's accounting (sacct) this far back at most; 0: off "
        "(docs/catch-up.md)",
    )
    catch_up_gap_s: float = Field(
        default=60.0,
        ge=5,
        le=86400,
        description="a gap between two good polls longer than this is caught up from accounting",
    )
    catch_up_max_jobs: int = Field(
        default=1000, ge=1, le=5000, description="ended jobs read from accounting per catch-up"
    )
    state_file: str | None = Field(
        default=None,
        description="where the watcher keeps the time of its last good poll, so that a "
        "restarted watcher catches up from there (without it: catch_up_window_s back)",
    )

    @model_validator(mode="after")
    def _paces_agree(self) -> WatchSettings:
        if self.reconcile_s >= self.catch_up_gap_s:
            raise ValueError(
                f"watch.reconcile_s ({self.reconcile_s:g}) must be below watch.catch_up_gap_s "
                f"({self.catch_up_gap_s:g}): a gap between two listings would be caught up "
                "from accounting each time"
            )
        return self


class ConfigPolicy(Policy):
    """The ``policy`` section as a configuration file gives it: :class:`Policy` (bounds
    included) with every key known. (Policy itself travels in workflow inputs, and a history
    recorded before a field was dropped must still decode: it ignores unknown keys.)"""

    model_config = STRICT  # a misspelt `mdoe:` is an error, not a silent monitor mode

    @model_validator(mode="before")
    @classmethod
    def _from_policy(cls, data: Any) -> Any:
        """A :class:`Policy` built in code (tests, the benchmarks) is checked like a file's."""
        if isinstance(data, Policy) and not isinstance(data, ConfigPolicy):
            return data.model_dump()
        return data


class JobOutputSettings(BaseModel):
    """Which job output files (a job's ``--output``/``--error``) Relaunch may read.

    A job's paths are its user's choice, so a file is read only when it is a regular file (no
    FIFO, device or final symbolic link), its real path (symbolic links in its directories
    resolved) lies under one of ``allowed_roots``, and the job's own user could read it (its
    uid and groups against the file's mode and its directories'). Anything else is recorded as
    refused in the evidence, never read."""

    model_config = ConfigDict(extra="forbid")

    allowed_roots: list[str] = Field(
        default_factory=lambda: ["/"],
        description="directories job output may be read from, e.g. [/home, /scratch]; "
        "compared with the file's real path (symbolic links resolved)",
    )
    read_timeout_s: float = Field(
        default=10.0, gt=0, le=300, description="a read slower than this counts as refused"
    )

    @field_validator("allowed_roots")
    @classmethod
    def _absolute(cls, value: list[str]) -> list[str]:
        if not value:
            raise ValueError("allowed_roots must name at least one directory")
        for root in value:
            if not root.startswith("/"):
                raise ValueError(f"allowed root {root!r} is not an absolute path")
        return value


class ConsoleSettings(BaseModel):
    """The Recovery Console (`relaunch console`): where it listens and who may sign in."""

    model_config = STRICT

    tokens_file: str | None = Field(
        default=None,
        description='JSON list of {"name", "role", "sha256"}: only hashes of the tokens',
    )
    host: str = "127.0.0.1"
    port: int = Field(default=8400, ge=1, le=65535)
    session_secret_env: str = Field(
        default="RELAUNCH_CONSOLE_SECRET",
        description="environment variable holding the session-signing secret "
        "(unset: a random one per process, and sessions end when it restarts)",
    )
    behind_tls: bool = Field(
        default=False,
        description="the console is served over HTTPS by a proxy in front of it: cookies get "
        "Secure even though the proxy talks plain HTTP to the console",
    )
    intake_events_per_minute: int = Field(
        default=300,
        ge=1,
        le=1_000_000,
        description="events (alerts, health events, Slurm events, repair callbacks) each intake "
        "token may push in per minute, on average; past that the intake answers 429 with "
        "Retry-After and records nothing",
    )
    intake_burst: int = Field(
        default=300,
        ge=1,
        le=1_000_000,
        description="events an intake token may push in at once before the per-minute rate applies",
    )


class AuditSettings(BaseModel):
    """How long the audit trail keeps a cluster's incidents (docs/retention.md)."""

    model_config = STRICT

    retention_days: int | None = Field(
        default=None,
        ge=30,
        le=36_500,
        description="`relaunch audit purge` without --before deletes the incidents wholly older "
        "than this many days, with their rows and bundles; unset: nothing is purged by schedule",
    )
    partitions_ahead: int = Field(
        default=3,
        ge=1,
        le=24,
        description="months of audit partitions `relaunch audit maintain` and each purge make "
        "ahead of time",
    )


# A listen address: a host name or an IP literal (IPv6 in brackets), a colon, a port.
_LISTEN = re.compile(
    r"(?P<host>[A-Za-z0-9][A-Za-z0-9.-]{0,252}|\[[0-9A-Fa-f:.]{2,45}\]):(?P<port>\d{1,5})"
)
METRICS_OFF = "off"


def listen_address(value: str) -> tuple[str, int] | None:
    """``host:port`` (``[::1]:9410`` for IPv6) as a pair; None for ``off``. ValueError when it is
    neither, or the port is outside 1-65535."""
    if value == METRICS_OFF:
        return None
    match = _LISTEN.fullmatch(value)
    if match is None:
        raise ValueError(f"{value!r} is not host:port (e.g. 127.0.0.1:9410, 0.0.0.0:9410) nor off")
    port = int(match["port"])
    if not 1 <= port <= 65535:
        raise ValueError(f"port {port} of {value!r} is outside 1-65535")
    return match["host"].strip("[]"), port


class MetricsSettings(BaseModel):
    """Where the worker and the watcher serve ``/metrics`` and ``/healthz`` (docs/metrics.md)."""

    model_config = STRICT

    watch_address: str = Field(
        default=METRICS_OFF,
        description="host:port of the watcher's /metrics and /healthz (e.g. 0.0.0.0:9410), or off",
    )
    worker_address: str = Field(
        default=METRICS_OFF,
        description="host:port of the worker's /metrics (its Temporal SDK series and its own) "
        "and /healthz, or off; with `--processes N`, child i listens on port + i - 1",
    )

    @field_validator("watch_address", "worker_address")
    @classmethod
    def _address(cls, value: str) -> str:
        listen_address(value)
        return value


# A DNS name or an IPv4/IPv6 literal; nothing that could read as an option or a user@ prefix.
_SSH_HOST = re.compile(r"[A-Za-z0-9][A-Za-z0-9.-]{0,252}|[0-9A-Fa-f:.]{2,45}")


class SshSettings(BaseModel):
    """Run the Slurm commands on a login/controller host over SSH instead of locally.

    Key-based authentication only, and the host's key must already be in ``known_hosts``: an
    unknown or changed key is refused, never accepted on first use. ``slurm_conf`` of the
    cluster then names the file on that host."""

    model_config = ConfigDict(extra="forbid")  # a stray `password:` is an error, not ignored

    host: str = Field(description="the login or controller host that runs the Slurm clients")
    port: int = Field(default=22, ge=1, le=65535)
    user: str = Field(
        description="the account the Slurm commands run as (drains need root "
        "or SlurmUser, or an operator role in Slurm's accounting)"
    )
    key_file: str = Field(min_length=1, description="the client's private key (unencrypted)")
    known_hosts: str = Field(
        min_length=1, description="an OpenSSH known_hosts file that holds the host's key"
    )
    connect_timeout_s: float = Field(default=10.0, gt=0, le=300)
    command_timeout_s: float = Field(default=30.0, gt=0, le=3600)
    keepalive_s: float = Field(
        default=15.0,
        ge=0,
        le=3600,
        description="keepalive interval on an idle connection; 0 turns it off",
    )
    max_sessions: int = Field(
        default=8, ge=1, le=64, description="commands in flight at once (sshd's MaxSessions is 10)"
    )

    @field_validator("host")
    @classmethod
    def _host(cls, value: str) -> str:
        if not _SSH_HOST.fullmatch(value):
            raise ValueError(f"invalid ssh host {value!r}: a host name or an IP address")
        return value

    @field_validator("user")
    @classmethod
    def _user(cls, value: str) -> str:
        return names.user_name(value)


# The PATH after `slurm_bin` on an SSH host (its own login PATH is not known here).
REMOTE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


class ClusterConfig(BaseModel):
    """One cluster Relaunch serves. Written by `relaunch dev up` for the local stack.
    `relaunch config check --config FILE` validates one (deploy/README.md)."""

    model_config = STRICT

    name: str
    slurm_conf: str | None = None
    slurm_bin: str | None = Field(
        default=None,
        description="the folder of the Slurm client commands (squeue, scontrol, sbatch, sacct), "
        "put first on PATH; they must be the release of the site's controller. Unset: PATH",
    )
    ssh: SshSettings | None = Field(
        default=None, description="run the Slurm commands on this host over SSH; unset: locally"
    )
    slurmrestd: SlurmRestSettings | None = Field(
        default=None,
        description="read (and hold/release/cancel) over slurmrestd; unset: the CLI does all",
    )
    temporal_address: str = "127.0.0.1:7233"
    temporal_tls: TemporalTlsSettings | None = Field(
        default=None, description="TLS/mTLS to the Temporal frontend; unset: plaintext"
    )
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
    launcher_health_pattern: str | None = Field(
        default=None,
        description="each node's health file for the jobs' own launchers, with {node}, e.g. "
        "/shared/relaunch/health/{node}: there while the node is in service, removed the "
        "moment Relaunch convicts it (NVRx ft_launcher --ft-storage-health-check-path; "
        "docs/spares.md). Unset: none written",
    )
    job_output: JobOutputSettings = Field(
        default_factory=JobOutputSettings,
        description="which job output files may be read, and how long a read may take",
    )
    logs: LogStoreSettings = Field(
        default_factory=LogStoreSettings,
        description="job and kernel logs: files, Loki, VictoriaLogs",
    )
    policy: ConfigPolicy = Field(default_factory=ConfigPolicy)
    watch: WatchSettings = Field(default_factory=WatchSettings)
    console: ConsoleSettings = Field(default_factory=ConsoleSettings)
    notify: NotifySettings = Field(
        default_factory=NotifySettings,
        description="webhook, Slack and PagerDuty channels (`relaunch console` sends)",
    )
    lifecycle: LifecycleSettings = Field(
        default_factory=LifecycleSettings,
        description="what happens to a node Relaunch drains: checks, the remediation ladder, "
        "repair (docs/lifecycle.md)",
    )
    tracing: TracingSettings = Field(
        default_factory=TracingSettings,
        description="OpenTelemetry traces of each recovery over OTLP/HTTP (docs/tracing.md); "
        "unset endpoint: off",
    )
    audit: AuditSettings = Field(
        default_factory=AuditSettings,
        description="retention of the audit trail and its bundles (docs/retention.md)",
    )
    metrics: MetricsSettings = Field(
        default_factory=MetricsSettings,
        description="the worker's and the watcher's /metrics and /healthz (docs/metrics.md); "
        "off by default",
    )
    rollout: RolloutSettings = Field(
        default_factory=RolloutSettings,
        description="how the scorecard judges recommendations and when it suggests promoting a "
        "category or partition to autonomous (docs/autonomy.md)",
    )

    @property
    def slurm_env(self) -> dict[str, str]:
        """The environment overlay of every local Slurm command."""
        env = {"SLURM_CONF": self.slurm_conf} if self.slurm_conf else {}
        if self.slurm_bin:
            env["PATH"] = f"{self.slurm_bin}:{os.environ.get('PATH', os.defpath)}"
        return env

    @property
    def remote_slurm_env(self) -> dict[str, str]:
        """The overlay of every Slurm command run over SSH (a PATH of the remote host's)."""
        env = {"SLURM_CONF": self.slurm_conf} if self.slurm_conf else {}
        if self.slurm_bin:
            env["PATH"] = f"{self.slurm_bin}:{REMOTE_PATH}"
        return env

    @field_validator("slurm_bin")
    @classmethod
    def _slurm_bin(cls, value: str | None) -> str | None:
        if value is not None and (not value.startswith("/") or ":" in value):
            raise ValueError(f"slurm_bin must be an absolute folder without ':' (got {value!r})")
        return value
