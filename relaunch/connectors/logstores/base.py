"""What every log store offers, and the HTTP plumbing Loki and VictoriaLogs share."""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from collections.abc import Mapping
from datetime import UTC, datetime
from types import TracebackType

import httpx
from pydantic import BaseModel, ConfigDict, Field

from relaunch.models.errors import (
    LogQueryError,
    LogStoreAuthError,
    LogStoreError,
    LogStoreUnavailableError,
)
from relaunch.models.logstore import LogStoreSettings, render_template

_ERROR_TEXT = 300


class LogLine(BaseModel):
    """One log entry: when the store says it happened, its text, and its stream's labels."""

    model_config = ConfigDict(frozen=True)

    time: datetime
    text: str
    labels: dict[str, str] = Field(default_factory=dict)


class LogSelector(BaseModel):
    """Which entries to read: a rendered stream selector (LogQL or LogsQL filters) and an
    optional substring every line must contain. Build it with :func:`job_selector` or
    :func:`node_selector`, which validate and escape what they substitute."""

    model_config = ConfigDict(frozen=True)

    query: str
    contains: str | None = None


def job_selector(
    settings: LogStoreSettings, cluster: str, job_id: str, *, contains: str | None = None
) -> LogSelector:
    """The selector of one job's output, from the cluster's ``job_query`` template."""
    if not settings.job_query:
        raise LogStoreError("logs.job_query is not configured")
    return LogSelector(
        query=render_template(settings.job_query, cluster=cluster, job_id=job_id),
        contains=contains,
    )


def node_selector(
    settings: LogStoreSettings, cluster: str, node: str, *, contains: str | None = None
) -> LogSelector | None:
    """The selector of one node's kernel log, or None when ``node_query`` is not configured."""
    if not settings.node_query:
        return None
    return LogSelector(
        query=render_template(settings.node_query, cluster=cluster, node=node), contains=contains
    )


def to_ns(moment: datetime) -> int:
    """Nanoseconds since the Unix epoch (a naive datetime is taken as UTC)."""
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    delta = moment - datetime(1970, 1, 1, tzinfo=UTC)
    return (delta.days * 86_400 + delta.seconds) * 1_000_000_000 + delta.microseconds * 1000


def from_ns(ns: int) -> datetime:
    return datetime.fromtimestamp(ns // 1_000_000_000, UTC).replace(
        microsecond=(ns % 1_000_000_000) // 1000
    )


def read_secret(env_name: str, environ: Mapping[str, str]) -> str:
    value = environ.get(env_name)
    if not value:
        raise LogStoreError(
            f"environment variable {env_name} is not set",
            hint="export it in the worker's environment (the config file names it, never holds it)",
        )
    return value


class LogStore(ABC):
    """A read-only log store."""

    name = "log store"

    def __init__(self, settings: LogStoreSettings) -> None:
        self.settings = settings

    @abstractmethod
    async def fetch(
        self,
        selector: LogSelector,
        start: datetime,
        end: datetime,
        limit: int,
        *,
        newest: bool = False,
    ) -> list[LogLine]:
        """Entries in ``[start, end)``, oldest first: the first ``limit`` of them, or with
        ``newest`` the last ``limit`` (what a tail of the log file would show)."""

    async def aclose(self) -> None:  # noqa: B027 - optional for stores without a client
        """Release connections."""

    async def __aenter__(self) -> LogStore:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()


class HttpLogStore(LogStore):
    """A store behind HTTP: one client with auth and tenant headers, errors mapped to types.

    Secrets are read from the environment once, sent only as headers, and scrubbed from any
    text that could end up in an error message."""

    def __init__(
        self,
        settings: LogStoreSettings,
        *,
        environ: Mapping[str, str] | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        super().__init__(settings)
        env = os.environ if environ is None else environ
        headers = self.tenant_headers(settings.tenant)
        self._secrets: list[str] = []
        auth: httpx.Auth | None = None
        if settings.token_env:
            token = read_secret(settings.token_env, env)
            self._secrets.append(token)
            headers["Authorization"] = f"Bearer {token}"
        elif settings.username and settings.password_env:
            password = read_secret(settings.password_env, env)
            self._secrets.append(password)
            auth = httpx.BasicAuth(settings.username, password)
        self.base_url = (settings.url or "").rstrip("/")
        self._client = httpx.AsyncClient(
            base_url=self.base_url,
            headers=headers,
            auth=auth,
            timeout=settings.timeout_s,
            transport=transport,
        )

    def tenant_headers(self, tenant: str | None) -> dict[str, str]:
        return {}

    async def aclose(self) -> None:
        await self._client.aclose()

    def _scrub(self, text: str) -> str:
        for secret in self._secrets:
            text = text.replace(secret, "***")
        return text

    def _transport_error(self, exc: httpx.TransportError) -> LogStoreUnavailableError:
        if isinstance(exc, httpx.TimeoutException):
            return LogStoreUnavailableError(
                f"{self.name} at {self.base_url} did not answer within {self.settings.timeout_s} s"
            )
        detail = self._scrub(str(exc)) or type(exc).__name__
        return LogStoreUnavailableError(
            f"cannot reach {self.name} at {self.base_url}: {detail}",
            hint=f"is {self.name} running, and is logs.url right?",
        )

    def _check_status(self, status: int, body: str) -> None:
        """Raise the typed error for a failed answer (``body``: the server's own text)."""
        if status < 400:
            return
        text = self._scrub(body.strip())[:_ERROR_TEXT] or "(no text)"
        if status in (401, 403):
            raise LogStoreAuthError(
                f"{self.name} refused the request (HTTP {status}): {text}",
                hint="check logs.token_env / logs.username + password_env and logs.tenant",
            )
        if status == 429 or status >= 500:
            raise LogStoreUnavailableError(f"{self.name} is unavailable (HTTP {status}): {text}")
        if status == 400:
            raise LogQueryError(
                f"{self.name} rejected the query (HTTP 400): {text}",
                hint="check logs.job_query / logs.node_query",
            )
        raise LogStoreError(
            f"{self.name} answered HTTP {status}: {text}",
            hint=f"is logs.url the base URL of the {self.name} API?",
        )
