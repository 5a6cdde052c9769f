"""What activities need, built once per worker process and injected."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import wraps
from typing import ParamSpec, TypeVar

from temporalio.exceptions import ApplicationError

from relaunch.connectors.audit import AuditStore
from relaunch.connectors.logstores import LogStore
from relaunch.connectors.slurm.cli import SlurmCli
from relaunch.models.config import ClusterConfig
from relaunch.models.errors import RelaunchError
from relaunch.models.recovery import AuditRecord

P = ParamSpec("P")
R = TypeVar("R")


@dataclass
class Deps:
    config: ClusterConfig
    scheduler: SlurmCli
    audit: AuditStore
    log_store: LogStore | None = None  # None: job and kernel logs are read from files

    async def audit_row(
        self,
        incident_id: str,
        kind: str,
        summary: str,
        *,
        dedupe: str | None,
        nodes: list[str] | None = None,
        stage: str | None = None,
        actor: str = "relaunch",
        data: dict[str, object] | None = None,
    ) -> bool:
        return await self.audit.record(
            AuditRecord(
                incident_id=incident_id,
                kind=kind,
                at=datetime.now(UTC),
                actor=actor,
                stage=stage,
                nodes=nodes or [],
                summary=summary,
                data=data or {},
            ),
            dedupe_key=f"{incident_id}:{dedupe}" if dedupe else None,
        )


def typed_errors(fn: Callable[P, Awaitable[R]]) -> Callable[P, Awaitable[R]]:
    """Map Relaunch's typed errors to Temporal ApplicationErrors at the activity boundary:
    the class name becomes the error type, and only retryable errors are retried."""

    @wraps(fn)
    async def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return await fn(*args, **kwargs)
        except RelaunchError as exc:
            raise ApplicationError(
                str(exc), type=type(exc).__name__, non_retryable=not exc.retryable
            ) from exc

    return wrapper
