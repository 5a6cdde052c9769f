"""Signals pushed in: Prometheus Alertmanager's webhook (version 4) and Slurm's hooks.

Parsing is strict about shape and names (anything that may reach a Slurm command line is checked
against :mod:`relaunch.models.names`) and lenient about what Alertmanager may add later."""

from __future__ import annotations

import hashlib
import json
from datetime import datetime
from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field, field_validator

from relaunch.models import names

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
