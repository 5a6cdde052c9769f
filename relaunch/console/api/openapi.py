"""The OpenAPI 3.1 document of `/api/v1`, generated from the endpoints themselves: their paths,
parameters and roles, and the JSON schemas of the very pydantic models they answer with (as
components), so that the document cannot drift from the API."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from relaunch.console.api.endpoint import CSRF_HEADER, PREFIX, Endpoint
from relaunch.console.api.models import ApiError
from relaunch.console.auth import SESSION_COOKIE

OPENAPI_PATH = "/openapi.json"
REF = "#/components/schemas/{model}"
_PATH_PARAM = re.compile(r"{(\w+)}")
STATUS_WORDS = {
    400: "a bad parameter or body (`field` names it)",
    401: "no token, or an unknown one",
    403: "the role does not allow it, the token is limited to other clusters, or a session "
    "cookie's call lacks its CSRF token",
    404: "no such incident, node or cluster (or one outside the token's clusters)",
    409: "the incident does not wait for this decision (another step waits, or it was decided "
    "otherwise)",
    413: "the body is too large",
    422: "the Idempotency-Key was sent before with another request",
    500: "the console failed (see its log)",
    503: "PostgreSQL or Temporal does not answer: retry",
}

Mode = Literal["validation", "serialization"]


def _models(endpoints: Sequence[Endpoint]) -> list[tuple[type[BaseModel], Mode]]:
    seen: list[tuple[type[BaseModel], Mode]] = [(ApiError, "serialization")]
    for ep in endpoints:
        for pair in ((ep.answer, "serialization"), (ep.body, "validation")):
            model, mode = pair
            if model is not None and (model, mode) not in seen:
                seen.append((model, mode))  # type: ignore[arg-type]
    return seen


def _json(schema: dict[str, Any]) -> dict[str, Any]:
    return {"application/json": {"schema": schema}}


Refs = Mapping[tuple[Any, Mode], dict[str, Any]]


def _operation(ep: Endpoint, refs: Refs) -> dict[str, Any]:
    params: list[dict[str, Any]] = [
        {"name": name, "in": "path", "required": True, "schema": {"type": "string"}}
        for name in _PATH_PARAM.findall(ep.path)
    ]
    params += [
        {
            "name": p.name,
            "in": "query",
            "required": False,
            "description": p.description,
            "schema": p.schema,
        }
        for p in ep.query
    ]
    params += [
        {
            "name": h.name,
            "in": "header",
            "required": False,
            "description": h.description,
            "schema": h.schema,
        }
        for h in ep.headers
    ]
    ok: dict[str, Any] = {"description": "OK", "content": _json(refs[(ep.answer, "serialization")])}
    if ep.method == "POST":
        ok["headers"] = {
            "Idempotent-Replayed": {
                "description": "true on the answer to a retry of a decision already taken",
                "schema": {"type": "string", "enum": ["true"]},
            }
        }
    codes = set(ep.errors) | {500, 503}
    if ep.query or ep.body:
        codes.add(400)
    if ep.role is not None:
        codes |= {401, 403}
    responses: dict[str, Any] = {"200": ok}
    for code in sorted(codes):
        responses[str(code)] = {
            "description": STATUS_WORDS[code],
            "content": _json(refs[(ApiError, "serialization")]),
        }
    op: dict[str, Any] = {
        "operationId": ep.operation_id,
        "summary": ep.summary,
        "tags": [ep.tag],
        "responses": responses,
        "security": [] if ep.role is None else [{"bearer": []}, {"session": []}],
        "x-relaunch-role": ep.role.value if ep.role else None,
    }
    doc = (ep.handler.__doc__ or "").strip()
    if doc:
        op["description"] = " ".join(doc.split())
    if params:
        op["parameters"] = params
    if ep.body is not None:
        op["requestBody"] = {"required": False, "content": _json(refs[(ep.body, "validation")])}
    return op


def document(endpoints: Sequence[Endpoint]) -> dict[str, Any]:
    """The OpenAPI 3.1 document of these endpoints (paths with the /api/v1 prefix)."""
    models = _models(endpoints)
    refs, defs = models_json_schema(models, ref_template=REF)
    paths: dict[str, dict[str, Any]] = {
        PREFIX + OPENAPI_PATH: {
            "get": {
                "operationId": "openapi",
                "summary": "This document (no sign-in needed)",
                "tags": ["meta"],
                "security": [],
                "responses": {
                    "200": {
                        "description": "the OpenAPI 3.1 document",
                        "content": _json({"type": "object"}),
                    }
                },
            }
        }
    }
    for ep in endpoints:
        paths.setdefault(PREFIX + ep.path, {})[ep.method.lower()] = _operation(ep, refs)
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "Relaunch Recovery Console API",
            "version": "1",
            "description": "Incidents, their timelines, verdicts and plans, nodes, the audit "
            "trail and the scorecard; approve and reject exactly once under retries "
            "(docs/api.md). Send `Authorization: Bearer <token>` (a console token: viewer, "
            "approver or admin), or the console's session cookie with the "
            f"`{CSRF_HEADER}` header on POST.",
        },
        "paths": paths,
        "components": {
            "schemas": defs.get("$defs", {}),
            "securitySchemes": {
                "bearer": {"type": "http", "scheme": "bearer"},
                "session": {"type": "apiKey", "in": "cookie", "name": SESSION_COOKIE},
            },
        },
    }
