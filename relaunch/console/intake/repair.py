"""``POST /intake/repair``: the repair system's callback, with a token of role ``repair`` only.
It says that a node its lifecycle sent to repair is repaired: the lifecycle that waits for it is
signalled (`returned`, as `relaunch nodes returned`) and validates the node before it returns it
to service (docs/lifecycle.md). It answers 202 with that lifecycle's id, 404 when no lifecycle
of the node runs, 409 when the node's lifecycle is not waiting for a repair (it is still checking
the node, or already validating it)."""

from __future__ import annotations

import logging
import re
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from relaunch.console.auth import ConsoleRole
from relaunch.console.intake.common import (
    IntakeRefused,
    addressed,
    limit,
    record_row,
    refusal_response,
    refused,
    unavailable,
)
from relaunch.models.errors import RelaunchError
from relaunch.models.intake import intake_incident as intake_incident  # where intake rows go
from relaunch.models.lifecycle import NoLifecycleError, RepairReturn
from relaunch.models.names import node_name

log = logging.getLogger("relaunch.console.intake.repair")

_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


class RepairCallback(BaseModel):
    """``POST /intake/repair``: the repair system (or a script) says ``node`` is repaired."""

    model_config = ConfigDict(extra="forbid")

    node: str = Field(description="the repaired node, as Slurm names it")
    by: str = Field(max_length=100, description="who repaired it (recorded)")
    ticket: str = Field(default="", max_length=64, description="the repair ticket")
    note: str = Field(default="", max_length=500, description="what was done (recorded)")

    @field_validator("node")
    @classmethod
    def _node(cls, value: str) -> str:
        return node_name(value)

    @field_validator("by", "ticket")
    @classmethod
    def _line(cls, value: str) -> str:
        if _CONTROL.search(value):
            raise ValueError("control characters are not allowed")
        return value.strip()

    @field_validator("note")
    @classmethod
    def _note(cls, value: str) -> str:
        if _CONTROL.search(value.replace("\n", " ").replace("\t", " ")):
            raise ValueError("control characters other than newlines and tabs are not allowed")
        return value.strip()

    @field_validator("by")
    @classmethod
    def _by(cls, value: str) -> str:
        if not value:
            raise ValueError("by must name who repaired the node")
        return value


def _parse_repair(raw: Any) -> RepairCallback:
    """The callback's body, or a 400 naming the field at fault."""
    if not isinstance(raw, dict):
        raise IntakeRefused(400, "body must be a JSON object", "body")
    try:
        return RepairCallback.model_validate(raw)
    except ValidationError as exc:
        raise refused(exc, 400, "the body takes node, by, ticket, note and cluster") from exc


async def repair(request: Request) -> Response:
    try:
        c, user, cl, raw = await addressed(request, ConsoleRole.REPAIR)
        body = _parse_repair(raw)
        limit(request, c, user, 1)
    except IntakeRefused as exc:
        return refusal_response(exc)
    signal = cl.services.repaired
    if signal is None:
        return unavailable("the console cannot reach Temporal (no repair signal configured)")
    told = RepairReturn(by=body.by, ticket=body.ticket, note=body.note)
    try:
        lifecycle = await signal(body.node, told)
    except RelaunchError as exc:
        if exc.retryable:
            log.warning("repair callback for %s not delivered: %s", body.node, exc.message)
            return unavailable(f"not delivered, retry later: {exc.message}")
        # recovery_client.signal_repaired: none of the node's lifecycles runs (404), or the
        # one that runs is not waiting for a repair (409).
        status = 404 if isinstance(exc, NoLifecycleError) else 409
        return JSONResponse({"error": exc.message, "field": "node"}, status_code=status)
    except Exception as exc:  # Temporal unreachable, RPC errors: the sender retries on 5xx
        log.warning("repair callback for %s not delivered: %s", body.node, type(exc).__name__)
        return unavailable(f"not delivered, retry later: {type(exc).__name__}")
    summary = (
        f"repair callback: {body.node} repaired, says {body.by}"
        + (f" (ticket {body.ticket})" if body.ticket else "")
        + f": {lifecycle} validates it"
    )
    try:  # the lifecycle records its own `repaired` row; this one names the sender
        await record_row(
            c,
            cl,
            summary,
            None,
            {"source": "repair", "sender": user.name, "lifecycle": lifecycle, **body.model_dump()},
            [body.node],
        )
    except Exception as exc:  # delivered: a retry would be refused (409), so answer 202
        log.warning("repair callback for %s not recorded: %s", body.node, type(exc).__name__)
    log.info("intake repair %s -> %s", body.node, lifecycle)
    return JSONResponse(
        {
            "lifecycle": lifecycle,
            "cluster": cl.name,
            "node": body.node,
            "note": "the lifecycle validates the node; it returns to service only if its "
            "checks pass",
        },
        status_code=202,
    )
