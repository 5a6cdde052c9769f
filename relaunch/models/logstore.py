"""Where a cluster's job logs and node kernel logs live: files (the default), Loki or VictoriaLogs.

A query template names the log streams of one job or one node; ``{cluster}``, ``{job_id}`` and
``{node}`` are filled in at query time. A placeholder may only stand inside a double-quoted
string of the template, and each value is validated (``relaunch.models.names``) and escaped
there, so nothing that comes from a job can add query syntax.
"""

from __future__ import annotations

import json
import re
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from relaunch.models import names

PLACEHOLDERS = ("cluster", "job_id", "node")
_PLACEHOLDER = re.compile(r"\{(cluster|job_id|node)\}")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
# Loki tenant ids: letters, digits and !-_.*'() ; `|` joins several tenants in one query.
_LOKI_TENANT = re.compile(r"[A-Za-z0-9!_.*'()|-]{1,150}")
# VictoriaLogs tenants: AccountID, optionally with ProjectID ("12" or "12:34").
_VL_TENANT = re.compile(r"[0-9]{1,10}(?::[0-9]{1,10})?")
_HIDDEN = "<hidden>"


class LogBackend(StrEnum):
    FILES = "files"
    LOKI = "loki"
    VICTORIALOGS = "victorialogs"


def quote_literal(text: str) -> str:
    """``text`` as one double-quoted LogQL / LogsQL string literal (Go escapes)."""
    return json.dumps(text, ensure_ascii=False)


def _string_spans(template: str) -> list[tuple[int, int, str]]:
    """(start, end, quote) of every string literal in ``template``; raises on an open one."""
    spans: list[tuple[int, int, str]] = []
    i = 0
    while i < len(template):
        quote = template[i]
        if quote not in "\"'`":
            i += 1
            continue
        j = i + 1
        while j < len(template) and template[j] != quote:
            j += 2 if template[j] == "\\" and quote != "`" else 1
        if j >= len(template):
            raise ValueError(f"unterminated {quote}-quoted string at column {i + 1}")
        spans.append((i, j + 1, quote))
        i = j + 1
    return spans


def check_template(template: str, required: str, *, pipes_allowed: bool) -> str:
    """Validate a query template: ``{required}`` present, every placeholder inside a
    double-quoted string, and (where filters are appended) no pipe outside strings."""
    spans = _string_spans(template)
    placeholders = list(_PLACEHOLDER.finditer(template))
    if not any(m.group(1) == required for m in placeholders):
        raise ValueError(f"must contain {{{required}}}")
    for match in placeholders:
        inside = [q for s, e, q in spans if s < match.start() and match.end() < e]
        if inside != ['"']:
            raise ValueError(
                f"{match.group(0)} must stand inside a double-quoted string, "
                f'e.g. host="{match.group(0)}"'
            )
    if not pipes_allowed:
        outside = "".join(
            template[a:b]
            for a, b in zip(
                [0] + [e for _, e, _ in spans],
                [s for s, _, _ in spans] + [len(template)],
                strict=True,
            )
        )
        if "|" in outside:
            raise ValueError("must be filters only, without `|` pipes (filters are appended)")
    return template


def render_template(template: str, *, cluster: str, job_id: str = "", node: str = "") -> str:
    """Fill the placeholders with validated, escaped values (each inside its string literal)."""
    values = {"cluster": names.cluster_name(cluster)}
    if "{job_id}" in template:
        values["job_id"] = names.job_id(job_id)
    if "{node}" in template:
        values["node"] = names.node_name(node)
    return _PLACEHOLDER.sub(lambda m: quote_literal(values[m.group(1)])[1:-1], template)


class LogStoreSettings(BaseModel):
    """The ``logs`` section of a cluster's configuration. Secrets are never in the file:
    ``token_env`` / ``password_env`` name environment variables that hold them."""

    model_config = ConfigDict(extra="forbid")

    backend: LogBackend = LogBackend.FILES
    url: str | None = Field(default=None, description="base URL, e.g. http://loki:3100")
    tenant: str | None = Field(
        default=None, description="Loki X-Scope-OrgID, or VictoriaLogs AccountID[:ProjectID]"
    )
    username: str | None = Field(default=None, description="basic auth user (with password_env)")
    password_env: str | None = None
    token_env: str | None = Field(default=None, description="bearer token's environment variable")
    job_query: str | None = Field(default=None, description="streams of one job, with {job_id}")
    node_query: str | None = Field(default=None, description="one node's kernel log, with {node}")
    timeout_s: float = Field(default=5.0, gt=0, le=300)
    page_size: int = Field(default=1000, ge=1, le=5000, description="Loki entries per request")
    job_lines: int = Field(default=20000, ge=1, le=1_000_000, description="newest job lines kept")
    node_lines: int = Field(default=5000, ge=1, le=1_000_000, description="per node")

    @model_validator(mode="before")
    @classmethod
    def _hide_secrets(cls, data: Any) -> Any:
        """A secret written into the file by mistake (an unknown key such as ``token``, a value
        in ``token_env`` that is no variable name, credentials in the url) is still refused,
        but validation errors show ``<hidden>`` instead of echoing it."""
        if not isinstance(data, dict):
            return data
        hidden = dict(data)
        for key, value in data.items():
            unknown = key not in cls.model_fields
            bad_env = key in ("password_env", "token_env") and not (
                isinstance(value, str) and _ENV_NAME.fullmatch(value)
            )
            userinfo = key == "url" and isinstance(value, str) and "@" in value
            if (unknown or bad_env or userinfo) and value is not None:
                hidden[key] = _HIDDEN
        return hidden

    @field_validator("password_env", "token_env")
    @classmethod
    def _env_name(cls, value: str | None) -> str | None:
        if value is not None and not _ENV_NAME.fullmatch(value):
            raise ValueError(
                "must be the name of an environment variable, e.g. RELAUNCH_LOKI_TOKEN"
            )
        return value

    @model_validator(mode="after")
    def _consistent(self) -> LogStoreSettings:
        if self.backend is LogBackend.FILES:
            return self
        where = f"logs (backend {self.backend.value})"
        if not self.url or not re.match(r"https?://[^/@\s]+(/\S*)?$", self.url):
            raise ValueError(
                f"{where}: url must be http(s)://host[:port][/prefix], without credentials"
            )
        if self.token_env and (self.username or self.password_env):
            raise ValueError(f"{where}: give token_env or username + password_env, not both")
        if bool(self.username) != bool(self.password_env):
            raise ValueError(f"{where}: username and password_env go together")
        if self.tenant is not None:
            pattern = _LOKI_TENANT if self.backend is LogBackend.LOKI else _VL_TENANT
            if not pattern.fullmatch(self.tenant):
                raise ValueError(f"{where}: tenant must match {pattern.pattern}")
        if not self.job_query:
            raise ValueError(f'{where}: job_query is required, e.g. {{slurm_job_id="{{job_id}}"}}')
        pipes = self.backend is LogBackend.LOKI
        for field, required in (("job_query", "job_id"), ("node_query", "node")):
            template = getattr(self, field)
            if template is None:
                continue
            try:
                check_template(template, required, pipes_allowed=pipes)
            except ValueError as exc:
                raise ValueError(f"{where}: {field} {exc}") from None
        return self
