"""Traces out: the ``tracing`` section of a cluster's configuration, and the names of the spans
and span attributes Relaunch itself writes (Temporal's interceptor names the rest).

No secret is ever part of the configuration: ``headers_env`` names the environment variable
that holds the collector's headers (an authorization token)."""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
_HIDDEN = "<hidden>"

# The root span of one recovery: from the watcher's first sight of the interruption to the
# signal-with-start that started its workflow. Everything the recovery does is below it.
RECOVERY_SPAN = "relaunch.recovery"
# The watcher reporting a failed node to its decision (a root of its own: the decision's).
NODE_REPORT_SPAN = "relaunch.node_report"
# Later detections handed over to a recovery already running: a child of its root.
FOLLOW_UP_SPAN = "relaunch.follow_up"

ATTR_INCIDENT = "relaunch.incident_id"
ATTR_JOB = "relaunch.job_id"
ATTR_CLUSTER = "relaunch.cluster"
ATTR_ATTEMPT = "relaunch.attempt"
ATTR_NODES = "relaunch.nodes"
ATTR_NODE = "relaunch.node"
ATTR_DETECTION_KIND = "relaunch.detection.kind"
ATTR_DETECTION_SOURCE = "relaunch.detection.source"
ATTR_DETECTIONS = "relaunch.detections"
ATTR_PROCESS = "relaunch.process"


class TracingSettings(BaseModel):
    """OpenTelemetry traces of every recovery, sent over OTLP/HTTP (protobuf) to a collector.

    Off unless ``otlp_endpoint`` is set; then the worker and the watcher each export their
    spans in the background, in batches: a collector that is slow or gone never holds up a
    recovery (its spans are dropped, and the process says so once)."""

    model_config = ConfigDict(extra="forbid")  # a pasted `headers: {authorization: …}` is refused

    otlp_endpoint: str | None = Field(
        default=None,
        description="the collector's OTLP/HTTP traces URL, path included, e.g. "
        "http://otel-collector:4318/v1/traces; unset: no tracing at all",
    )
    headers_env: str | None = Field(
        default=None,
        description="environment variable holding the export request's headers as "
        "`key=value,key2=value2` (values percent-encoded), e.g. an authorization token",
    )
    service_name: str = Field(
        default="relaunch", min_length=1, max_length=128, description="the `service.name`"
    )
    export_timeout_s: float = Field(
        default=5.0, gt=0, le=60, description="one export, retries included, gives up after this"
    )
    schedule_delay_s: float = Field(
        default=2.0, gt=0, le=60, description="ended spans wait at most this long to be sent"
    )

    @model_validator(mode="before")
    @classmethod
    def _hide_secrets(cls, data: Any) -> Any:
        """A secret written into the file by mistake (an unknown key, a value in ``headers_env``
        that is no variable name, credentials in the URL) is still refused, but the validation
        error shows ``<hidden>`` instead of echoing it."""
        if not isinstance(data, dict):
            return data
        hidden = dict(data)
        for key, value in data.items():
            unknown = key not in cls.model_fields
            bad_env = key == "headers_env" and not (
                isinstance(value, str) and _ENV_NAME.fullmatch(value)
            )
            userinfo = (
                key == "otlp_endpoint" and isinstance(value, str) and "@" in urlsplit(value).netloc
            )
            if (unknown or bad_env or userinfo) and value is not None:
                hidden[key] = _HIDDEN
        return hidden

    @field_validator("otlp_endpoint")
    @classmethod
    def _endpoint(cls, value: str | None) -> str | None:
        if value is None:
            return None
        parts = urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(
                "otlp_endpoint must be http(s)://host[:port]/path, without credentials "
                "(put a token in the variable headers_env names)"
            )
        if parts.query or parts.fragment:
            raise ValueError("otlp_endpoint takes no query or fragment")
        _ = parts.port  # a port that is no number, or out of range, is refused here
        return value

    @field_validator("headers_env")
    @classmethod
    def _env_name(cls, value: str | None) -> str | None:
        if value is not None and not _ENV_NAME.fullmatch(value):
            raise ValueError("must be the name of an environment variable, e.g. OTEL_HEADERS")
        return value

    @property
    def enabled(self) -> bool:
        return self.otlp_endpoint is not None
