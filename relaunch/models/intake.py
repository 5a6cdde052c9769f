"""Signals pushed in: Prometheus Alertmanager's webhook (version 4), Slurm's hooks, and
node-health events (NVSentinel's HealthEvent, or a generic shape).

Parsing is strict about shape and names (anything that may reach a Slurm command line is checked
against :mod:`relaunch.models.names`) and lenient about what Alertmanager or NVSentinel may add
later."""

from __future__ import annotations

import hashlib
import json
import re
from datetime import UTC, datetime
from enum import StrEnum
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, StrictBool, field_validator

from relaunch.models import names
from relaunch.models.bundle import HealthReport


def intake_incident(cluster: str) -> str:
    """The placeholder incident that what is pushed in, or seen from outside Relaunch (an
    external drain), is recorded under: every audit row names an incident, and lists of
    recoveries leave these out."""
    return f"intake-{cluster}"


def row_nodes(node: str) -> list[str]:
    """The nodes a health event's audit row names: the node as sent and, for a FQDN, its first
    label too (the name Slurm gives it, which the recovery's evidence looks up)."""
    short = node.split(".")[0]
    return [node, short] if short and short != node else [node]


def history_nodes(nodes: list[str]) -> list[str]:
    """The nodes a row from outside Relaunch is shown under: a FQDN the row also names by its
    first label is not a node of its own."""
    return [n for n in nodes if "." not in n or n.split(".")[0] not in nodes]


NODE_LABELS = ("Hostname", "hostname", "node", "instance")
JOB_LABELS = ("slurm_job_id", "job")
# Alertmanager's "zero" time for an alert that has not ended.
_TELEMETRY_WORDS = ("xid", "dcgm", "gpu", "nvlink", "ecc")


class AlertStatus(StrEnum):
    FIRING = "firing"
    RESOLVED = "resolved"


class Alert(BaseModel):
    """One alert of a webhook notification."""

    status: AlertStatus
    labels: dict[str, str]
    annotations: dict[str, str] = Field(default_factory=dict)
    startsAt: datetime  # noqa: N815 - Alertmanager's field names
    endsAt: datetime | None = None  # noqa: N815
    generatorURL: str = ""  # noqa: N815
    fingerprint: str = ""

    @property
    def name(self) -> str:
        return self.labels.get("alertname", "unnamed")

    @property
    def key(self) -> str:
        """Alertmanager's fingerprint (a hash of the labels when an old sender omits it)."""
        if self.fingerprint:
            return self.fingerprint
        canonical = json.dumps(sorted(self.labels.items()))
        return hashlib.sha256(canonical.encode()).hexdigest()[:16]

    def node(self) -> str | None:
        """The node the labels name: ``Hostname``/``hostname``/``node``, or ``instance``'s host
        part (``gpu07:9400`` → ``gpu07``). Raises InvalidNameError for an unsafe name."""
        for label in NODE_LABELS:
            value = self.labels.get(label)
            if value:
                host = value
                if label == "instance":
                    host = value.rsplit(":", 1)[0] if value.count(":") == 1 else value
                    host = host.strip("[]")
                return names.node_name(host)
        return None

    def job_id(self) -> str | None:
        """The Slurm job the labels name (``slurm_job_id``, or ``job`` when it is a job id:
        Prometheus's own ``job`` label names a scrape job, which is ignored)."""
        value = self.labels.get("slurm_job_id")
        if value:
            return names.job_id(value)
        value = self.labels.get("job", "")
        if value and value[0].isdigit():
            return names.job_id(value)
        return None

    def is_telemetry(self) -> bool:
        """A GPU/telemetry alert (dcgm-exporter's labels, or a GPU word in the name)."""
        if self.labels.get("relaunch_source") in {"telemetry", "scheduler"}:
            return self.labels["relaunch_source"] == "telemetry"
        if {"gpu", "UUID", "modelName", "Xid", "xid"} & self.labels.keys():
            return True
        return any(word in self.name.lower() for word in _TELEMETRY_WORDS)

    def text(self) -> str:
        for key in ("summary", "description", "message"):
            if self.annotations.get(key):
                return self.annotations[key]
        return ", ".join(f"{k}={v}" for k, v in sorted(self.labels.items()))


class AlertmanagerPayload(BaseModel):
    """Alertmanager's webhook body (``version`` "4")."""

    version: str
    receiver: str = ""
    status: AlertStatus
    alerts: list[Alert]
    groupKey: str = ""  # noqa: N815
    truncatedAlerts: int = 0  # noqa: N815
    externalURL: str = ""  # noqa: N815

    @field_validator("version")
    @classmethod
    def _v4(cls, value: str) -> str:
        if value != "4":
            raise ValueError(f"webhook payload version {value!r} is not supported (only '4')")
        return value


class SlurmEventKind(StrEnum):
    NODE_DOWN = "node_down"
    NODE_FAIL = "node_fail"
    JOB_END = "job_end"


class SlurmHookEvent(BaseModel):
    """What ``deploy/hooks/relaunch-notify-slurm.sh`` posts from strigger or an Epilog."""

    model_config = ConfigDict(extra="forbid")

    event: SlurmEventKind
    node: str | None = None
    job_id: str | None = None
    state: str | None = Field(default=None, max_length=64)
    time: datetime | None = None

    @field_validator("node")
    @classmethod
    def _node(cls, value: str | None) -> str | None:
        return names.node_name(value) if value else None

    @field_validator("job_id", mode="before")
    @classmethod
    def _job(cls, value: object) -> str | None:
        return names.job_id(value) if value not in (None, "") else None

    @field_validator("state")
    @classmethod
    def _state(cls, value: str | None) -> str | None:
        if value and not value.replace("_", "").replace("+", "").isalnum():
            raise ValueError(f"invalid job state {value!r}")
        return value.upper() if value else None


# ---------------------------------------------------------------------- node-health events

# NVSentinel's RecommendedAction enum (data-models/protobufs/health_event.proto): protojson
# sends the name, a sender that emits enum numbers sends these.
NVSENTINEL_ACTIONS = {
    0: "NONE",
    2: "COMPONENT_RESET",
    5: "CONTACT_SUPPORT",
    6: "RUN_FIELDDIAG",
    15: "RESTART_VM",
    24: "RESTART_BM",
    25: "REPLACE_VM",
    26: "RUN_DCGMEUD",
    39: "RESTART_APP",
    99: "UNKNOWN",
}
# NVSentinel's ProcessingStrategy: STORE_ONLY events are to be kept, never acted on.
NVSENTINEL_STRATEGIES = {0: "UNSPECIFIED", 1: "EXECUTE_REMEDIATION", 2: "STORE_ONLY"}
MAX_HEALTH_EVENTS = 100
MAX_CODES = 32
MAX_ENTITIES = 64
MAX_METADATA = 64
KEPT_TEXT = 1000  # of a message or a kernel line, in the audit trail and the bundle
_ENUM_NAME = re.compile(r"[A-Z][A-Z0-9_]{0,63}")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]+")

Short = Annotated[str, Field(max_length=128)]
Text = Annotated[str, Field(max_length=4096)]


def _enum_name(value: object, table: dict[int, str], what: str, example: str) -> str:
    """An enum sent by name (``RESTART_BM``) or by number (``24``), as its name."""
    if isinstance(value, int) and not isinstance(value, bool):
        return table.get(value, "UNKNOWN")
    if isinstance(value, str) and _ENUM_NAME.fullmatch(value):
        return value
    raise ValueError(f"{what} must be an upper-case name such as {example}, or its number")


def _utc(value: datetime | None) -> datetime | None:
    if value is not None and value.tzinfo is None:
        return value.replace(tzinfo=UTC)
    return value


def _one_line(value: str, limit: int = KEPT_TEXT) -> str:
    text = _CONTROL.sub(" ", value).strip()
    return text if len(text) <= limit else text[:limit] + "…"


class NvSentinelEntity(BaseModel):
    """An ``Entity`` of ``entitiesImpacted``: ``{"entityType": "PCI", "entityValue": ...}``."""

    model_config = ConfigDict(extra="ignore")

    entityType: str = Field(default="", max_length=64)  # noqa: N815 - NVSentinel's names
    entityValue: str = Field(default="", max_length=256)  # noqa: N815


class NvSentinelHealthEvent(BaseModel):
    """NVSentinel's ``HealthEvent`` (data-models/protobufs/health_event.proto) as protojson
    writes it: camelCase names, enums by name (or number), fields at their zero value left
    out. Fields NVSentinel may add later are ignored."""

    model_config = ConfigDict(extra="ignore")

    version: int = Field(default=1, ge=0, le=2**32 - 1)
    agent: str = Field(default="", max_length=128)
    componentClass: str = Field(default="", max_length=64)  # noqa: N815
    checkName: str = Field(default="", max_length=128)  # noqa: N815
    isFatal: StrictBool = False  # noqa: N815
    isHealthy: StrictBool = False  # noqa: N815
    message: str = Field(default="", max_length=4096)
    recommendedAction: str = "NONE"  # noqa: N815
    errorCode: list[Short] = Field(default_factory=list, max_length=MAX_CODES)  # noqa: N815
    entitiesImpacted: list[NvSentinelEntity] = Field(  # noqa: N815
        default_factory=list, max_length=MAX_ENTITIES
    )
    metadata: dict[Short, Text] = Field(default_factory=dict, max_length=MAX_METADATA)
    generatedTimestamp: datetime | None = None  # noqa: N815
    nodeName: str  # noqa: N815
    processingStrategy: str = "UNSPECIFIED"  # noqa: N815

    @field_validator("nodeName")
    @classmethod
    def _node(cls, value: str) -> str:
        return names.node_name(value)

    @field_validator("recommendedAction", mode="before")
    @classmethod
    def _action(cls, value: object) -> str:
        return _enum_name(value, NVSENTINEL_ACTIONS, "recommendedAction", "RESTART_BM")

    @field_validator("processingStrategy", mode="before")
    @classmethod
    def _strategy(cls, value: object) -> str:
        return _enum_name(value, NVSENTINEL_STRATEGIES, "processingStrategy", "STORE_ONLY")

    @field_validator("generatedTimestamp", mode="before")
    @classmethod
    def _timestamp(cls, value: object) -> object:
        # Go's encoding/json writes a Timestamp as {"seconds": ..., "nanos": ...}.
        if isinstance(value, dict) and set(value) <= {"seconds", "nanos"}:
            seconds, nanos = value.get("seconds", 0), value.get("nanos", 0)
            if not all(
                isinstance(v, int | str) and not isinstance(v, bool) for v in (seconds, nanos)
            ):
                raise ValueError("seconds and nanos must be integers")
            return datetime.fromtimestamp(int(seconds) + int(nanos) / 1e9, UTC)
        return value

    @field_validator("generatedTimestamp")
    @classmethod
    def _aware(cls, value: datetime | None) -> datetime | None:
        return _utc(value)

    @property
    def store_only(self) -> bool:
        """NVSentinel's STORE_ONLY: keep the event, never act on it."""
        return self.processingStrategy == "STORE_ONLY"

    def report(self, *, sender: str, trusted: bool) -> HealthReport:
        journal = self.metadata.get("JOURNAL_MESSAGE", "")
        return HealthReport(
            node=self.nodeName,
            time=self.generatedTimestamp,
            component=_one_line(self.componentClass, 64),
            check=_one_line(self.checkName, 128),
            error_codes=[_one_line(c, 128) for c in self.errorCode],
            recommended_action=self.recommendedAction,
            is_fatal=self.isFatal,
            is_healthy=self.isHealthy,
            message=_one_line(self.message),
            journal=_one_line(journal),
            entities=[
                _one_line(f"{e.entityType}:{e.entityValue}", 300) for e in self.entitiesImpacted
            ],
            source="nvsentinel" + (f"/{_one_line(self.agent, 128)}" if self.agent else ""),
            sender=sender,
            trusted=trusted,
        )


class NvSentinelHealthEvents(BaseModel):
    """NVSentinel's ``HealthEvents``: several events in one request."""

    model_config = ConfigDict(extra="ignore")

    version: int = Field(default=1, ge=0, le=2**32 - 1)
    events: list[NvSentinelHealthEvent] = Field(min_length=1, max_length=MAX_HEALTH_EVENTS)


class GenericHealthEvent(BaseModel):
    """The generic shape, for any health checker: ``{"node", "is_fatal", "component",
    "error_code", "message", "recommended_action", "is_healthy", "time", "source"}``; only
    ``node`` and ``is_fatal`` are required. ``recommended_action`` takes NVSentinel's names."""

    model_config = ConfigDict(extra="forbid")

    node: str
    is_fatal: StrictBool
    is_healthy: StrictBool = False
    component: str = Field(default="", max_length=64)
    error_code: list[Short] = Field(default_factory=list, max_length=MAX_CODES)
    message: str = Field(default="", max_length=4096)
    recommended_action: str = "NONE"
    time: datetime | None = None
    source: str = Field(default="", max_length=128)

    @field_validator("node")
    @classmethod
    def _node(cls, value: str) -> str:
        return names.node_name(value)

    @field_validator("error_code", mode="before")
    @classmethod
    def _codes(cls, value: object) -> object:
        return [value] if isinstance(value, str) else value

    @field_validator("recommended_action", mode="before")
    @classmethod
    def _action(cls, value: object) -> str:
        return _enum_name(value, NVSENTINEL_ACTIONS, "recommended_action", "RESTART_BM")

    @field_validator("time")
    @classmethod
    def _aware(cls, value: datetime | None) -> datetime | None:
        return _utc(value)

    @property
    def store_only(self) -> bool:
        return False

    def report(self, *, sender: str, trusted: bool) -> HealthReport:
        return HealthReport(
            node=self.node,
            time=self.time,
            component=_one_line(self.component, 64),
            error_codes=[_one_line(c, 128) for c in self.error_code],
            recommended_action=self.recommended_action,
            is_fatal=self.is_fatal,
            is_healthy=self.is_healthy,
            message=_one_line(self.message),
            source=_one_line(self.source, 128),
            sender=sender,
            trusted=trusted,
        )


HealthEvent = NvSentinelHealthEvent | GenericHealthEvent
