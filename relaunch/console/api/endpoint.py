"""One `/api/v1` endpoint: its method, path, query parameters, body and answer models, and
the role it needs — the one description both the route and the OpenAPI document are made
from. Serving one checks the parameters and the caller (the console's tokens, roles, session
cookies and CSRF), runs the handler, and turns every refusal or failure into JSON
``{"error": ..., "field": ...}``: never a page, never a traceback."""

from __future__ import annotations

import base64
import binascii
import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from pydantic import BaseModel
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from relaunch.console.api.models import ApiError
from relaunch.console.auth import ConsoleRole
from relaunch.console.web import (
    Auth,
    Console,
    Forbidden,
    NotSignedIn,
    Problem,
    cluster_param,
    console,
    require,
)
from relaunch.models.errors import RelaunchError

log = logging.getLogger("relaunch.console.api")

PREFIX = "/api/v1"
CSRF_HEADER = "X-CSRF-Token"


class FieldProblem(Problem):
    """A 400 naming the query parameter, header or body field at fault."""

    def __init__(self, message: str, field: str | None, status: int = 400) -> None:
        super().__init__(message)
        self.field = field
        self.status = status


@dataclass
class Answer:
    """A handler's answer when it is more than the model: another status, extra headers."""

    model: BaseModel
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)


@dataclass
class Call:
    """One request to an endpoint, with its caller (None only where no sign-in is needed)."""

    request: Request
    caller: Auth | None

    @property
    def auth(self) -> Auth:
        if self.caller is None:
            raise NotSignedIn("send Authorization: Bearer <token>")
        return self.caller

    @property
    def c(self) -> Console:
        return console(self.request)

    def param(self, name: str) -> str:
        return self.request.query_params.get(name, "").strip()

    def path(self, name: str) -> str:
        return str(self.request.path_params[name])


Handler = Callable[[Call], Awaitable[BaseModel | Answer]]


@dataclass(frozen=True)
class Param:
    """A query parameter: its name, what it does, and its JSON schema."""

    name: str
    description: str
    schema: dict[str, Any] = field(default_factory=lambda: {"type": "string"})


@dataclass(frozen=True)
class Endpoint:
    method: str
    path: str  # under PREFIX, OpenAPI's (and Starlette's) {name} for path parameters
    handler: Handler
    summary: str
    answer: type[BaseModel]
    role: ConsoleRole | None = ConsoleRole.VIEWER  # None: no sign-in
    query: tuple[Param, ...] = ()
    body: type[BaseModel] | None = None
    errors: tuple[int, ...] = ()
    headers: tuple[Param, ...] = ()  # request headers the endpoint reads
    tag: str = "incidents"

    @property
    def operation_id(self) -> str:
        return self.handler.__name__

    def route(self) -> Route:
        return Route(self.path, self.serve, methods=[self.method], name=self.operation_id)

    async def serve(self, request: Request) -> Response:
        try:
            self._known_params(request)
            caller = _caller(request, self.role, self.method)
            result = await self.handler(Call(request, caller))
            answer = result if isinstance(result, Answer) else Answer(result)
            if not isinstance(answer.model, self.answer):  # the document promises this model
                raise TypeError(f"{self.operation_id} answered a {type(answer.model).__name__}")
            return JSONResponse(
                answer.model.model_dump(mode="json"),
                status_code=answer.status,
                headers=answer.headers,
            )
        except Problem as exc:
            return problem_response(exc)
        except RelaunchError as exc:
            status = 503 if exc.retryable else 500
            if not exc.retryable:
                log.error("%s %s failed: %s", self.method, request.url.path, exc)
            return error_response(status, str(exc))
        except Exception:
            log.exception("%s %s failed", self.method, request.url.path)
            return error_response(500, "the console failed; see its log")

    def _known_params(self, request: Request) -> None:
        allowed = {p.name for p in self.query}
        for name in request.query_params:
            if name not in allowed:
                takes = ", ".join(sorted(allowed)) or "no query parameters"
                raise FieldProblem(f"unknown parameter {name!r}: this takes {takes}", name)


def _caller(request: Request, role: ConsoleRole | None, method: str) -> Auth | None:
    """The console's rules: a Bearer token or the signed-in session cookie, the role, and for
    a state-changing call with a cookie the session's CSRF token in ``X-CSRF-Token``."""
    if role is None:
        return None
    auth = require(request, role)
    if method != "GET" and auth.sid is not None:
        c = console(request)
        if not c.sessions.csrf_ok(auth.sid, request.headers.get(CSRF_HEADER)):
            raise Forbidden(
                "a call with the session cookie needs its CSRF token in the X-CSRF-Token "
                "header (GET /api/v1/me gives it); or send a Bearer token"
            )
    return auth


def error_response(status: int, error: str, field: str | None = None) -> JSONResponse:
    headers = {"www-authenticate": "Bearer"} if status == 401 else None
    body = ApiError(error=error, field=field)
    return JSONResponse(body.model_dump(mode="json"), status_code=status, headers=headers)


def problem_response(exc: Problem) -> JSONResponse:
    return error_response(exc.status, exc.message, getattr(exc, "field", None))


# ------------------------------------------------------------------ shared parameters


def cluster_of(call: Call) -> str | None:
    """The ``?cluster=`` filter (web.cluster_param: 403 outside the caller's scope), a bad name
    a 400 naming the parameter."""
    try:
        return cluster_param(call.request, call.auth)
    except Problem as exc:
        if type(exc) is Problem:
            raise FieldProblem(exc.message, "cluster") from exc
        raise


def limit_of(call: Call, default: int, high: int) -> int:
    raw = call.param("limit")
    if not raw:
        return default
    if not raw.isdigit() or not 1 <= int(raw) <= high:
        raise FieldProblem(f"limit must be a whole number from 1 to {high}, not {raw!r}", "limit")
    return int(raw)


def time_of(call: Call, name: str) -> datetime | None:
    raw = call.param(name)
    if not raw:
        return None
    try:
        parsed = datetime.fromisoformat(raw)
    except ValueError as exc:
        raise FieldProblem(
            f"{name} must be an ISO 8601 time such as 2026-05-01T12:00:00Z, not {raw!r}", name
        ) from exc
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def encode_cursor(kind: str, **position: Any) -> str:
    """An opaque cursor: where the next page starts, and which list it belongs to."""
    raw = json.dumps({"k": kind, **position}, separators=(",", ":"), default=str)
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def decode_cursor(call: Call, kind: str) -> dict[str, Any] | None:
    raw = call.param("cursor")
    if not raw:
        return None
    try:
        data = json.loads(base64.urlsafe_b64decode(raw + "=" * (-len(raw) % 4)))
    except (binascii.Error, ValueError) as exc:
        raise FieldProblem(
            "cursor is not one this API gave: pass next_cursor as is", "cursor"
        ) from exc
    if not isinstance(data, dict) or data.get("k") != kind:
        raise FieldProblem(
            f"cursor is not one of this list ({kind}): pass its next_cursor", "cursor"
        )
    return data


def limit_param(default: int, high: int) -> Param:
    return Param(
        "limit",
        f"how many items a page holds (default {default})",
        {"type": "integer", "minimum": 1, "maximum": high},
    )


CURSOR = Param("cursor", "the previous page's next_cursor: the page after it")
