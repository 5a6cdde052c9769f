"""The Recovery Console's ASGI app: routes, error pages, security headers, lifespan."""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
from collections.abc import AsyncIterator, Awaitable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from urllib.parse import quote

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from relaunch.console import (
    intake,
    metrics,
    routes_audit,
    routes_auth,
    routes_incident,
    routes_jobs,
    routes_nodes,
    routes_overview,
    routes_scorecard,
)
from relaunch.console.api.routes import create_api
from relaunch.console.auth import Sessions, TokensFileError, TokenStore
from relaunch.console.background import Background
from relaunch.console.live import Broadcaster
from relaunch.console.queries import ConsoleDb
from relaunch.console.web import HERE, Cluster, Console, NotSignedIn, Problem, Services, render
from relaunch.models.config import ClusterConfig
from relaunch.models.errors import RelaunchError

log = logging.getLogger("relaunch.console")

SECURITY_HEADERS = [
    (
        b"content-security-policy",
        b"default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        b"frame-ancestors 'none'; form-action 'self'; base-uri 'none'",
    ),
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
    (b"referrer-policy", b"same-origin"),
]


class SecurityHeaders:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), *SECURITY_HEADERS]
            await send(message)

        await self.app(scope, receive, with_headers)


def _wants_json(request: Request) -> bool:
    path = request.url.path
    return (
        path.endswith((".json", ".csv"))
        or path == "/events"
        or request.headers.get("authorization", "").lower().startswith("bearer ")
        or "application/json" in request.headers.get("accept", "")
    )


def _problem_response(request: Request, status: int, title: str, message: str) -> Response:
    if _wants_json(request):
        return JSONResponse({"error": title, "detail": message}, status_code=status)
    return render(request, "error.html", None, status=status, title=title, message=message)


async def on_problem(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, Problem)
    if isinstance(exc, NotSignedIn) and not _wants_json(request):
        target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        return RedirectResponse(f"/login?next={quote(target, safe='')}", status_code=303)
    return _problem_response(request, exc.status, exc.title, exc.message)


async def on_relaunch_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, RelaunchError)
    status = 503 if exc.retryable else 500
    title = "Unavailable" if exc.retryable else "Error"
    return _problem_response(request, status, title, str(exc))


async def on_error(request: Request, exc: Exception) -> Response:
    log.exception("unhandled error on %s", request.url.path, exc_info=exc)
    return _problem_response(request, 500, "Internal error", "the console failed; see its log")


async def on_http(request: Request, exc: Exception) -> Response:
    status = int(getattr(exc, "status_code", 500))
    title = {404: "Not found", 405: "Method not allowed"}.get(status, "Error")
    return _problem_response(request, status, title, str(getattr(exc, "detail", "")))


HEALTH_TIMEOUT_S = 3.0


async def healthz(request: Request) -> Response:
    """200 ``ok`` while the console reaches its database and Temporal; else 503 with a line
    for each that does not answer within HEALTH_TIMEOUT_S (docs/metrics.md)."""
    console: Console = request.app.state.console

    async def database() -> None:
        async with console.db.connection() as conn:
            await conn.execute("select 1")

    checks: dict[str, Awaitable[None] | None] = {"database": database(), "temporal": None}
    if console.services.temporal_health is not None:
        checks["temporal"] = console.services.temporal_health()

    async def problem(name: str, check: Awaitable[None] | None) -> str | None:
        if check is None:
            return None
        try:
            async with asyncio.timeout(HEALTH_TIMEOUT_S):
                await check
        except TimeoutError:
            return f"{name}: no answer within {HEALTH_TIMEOUT_S:.0f} s"
        except Exception as exc:  # RelaunchError, the SDK's RPCError, RuntimeError, ...
            return f"{name}: {exc}"
        return None

    found = await asyncio.gather(*(problem(name, check) for name, check in checks.items()))
    problems = [line for line in found if line]
    if problems:
        return PlainTextResponse("\n".join(problems) + "\n", status_code=503)
    return PlainTextResponse("ok")


def session_secret(config: ClusterConfig) -> str:
    secret = os.environ.get(config.console.session_secret_env, "")
    if len(secret) >= 16:
        return secret
    log.warning(
        "%s is not set (or shorter than 16 characters): sessions end when the console restarts",
        config.console.session_secret_env,
    )
    return secrets.token_urlsafe(32)


class ClustersConfigError(RelaunchError):
    """The clusters given to one console cannot share it."""


def check_shared(config: ClusterConfig, others: Sequence[ClusterConfig]) -> None:
    """Refuse clusters that one console cannot serve together: each named once, and all on the
    primary's audit database and Temporal server (one control plane)."""
    seen = {config.name}
    for other in others:
        if other.name in seen:
            raise ClustersConfigError(
                f"cluster {other.name} is given twice",
                hint="give each cluster's configuration once",
            )
        seen.add(other.name)
        for field, what in (("database_url", "audit database"), ("temporal_address", "Temporal")):
            if getattr(other, field) != getattr(config, field):
                # The values may hold credentials: name the field, never print it.
                raise ClustersConfigError(
                    f"cluster {other.name} has another {field} than cluster {config.name}: "
                    f"one console serves clusters that share one {what}",
                    hint=f"give every configuration the same {field}, or run one console each",
                )


def create_app(
    config: ClusterConfig,
    services: Services | None = None,
    *,
    tokens_file: Path | None = None,
    secret: str | None = None,
    live_interval: float = 0.5,
    other_clusters: Sequence[tuple[ClusterConfig, Services]] = (),
) -> Starlette:
    """The console for ``config``'s cluster (the primary: its console settings and tokens rule)
    and, when given, ``other_clusters`` over the same PostgreSQL and Temporal. ``services``
    carries what acts on the primary (Temporal decisions and delivery, Slurm); each further
    cluster brings its own."""
    check_shared(config, [other for other, _ in other_clusters])
    path = tokens_file or (Path(config.console.tokens_file) if config.console.tokens_file else None)
    if path is None:
        raise TokensFileError(
            "the console has no tokens file",
            hint="set console.tokens_file in the cluster configuration",
        )
    db = ConsoleDb(config.database_url)
    state = Console(
        config=config,
        db=db,
        tokens=TokenStore(path),
        sessions=Sessions(secret or session_secret(config)),
        services=services or Services(),
        live=Broadcaster(db, interval=live_interval),
        others=[Cluster(other, acting) for other, acting in other_clusters],
    )

    background = Background([cl.config for cl in state.clusters.values()], db, state.pauses)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        await db.start()
        background.start()
        try:
            yield
        finally:
            await background.close()
            await state.live.close()
            await db.close()

    routes = [
        Route("/", routes_overview.overview),
        Route("/fragments/incidents", routes_overview.incidents_fragment),
        Route("/incidents/{incident_id}", routes_incident.incident_page),
        Route("/fragments/incident/{incident_id}", routes_incident.incident_fragment),
        Route("/incidents/{incident_id}/{decision}", routes_incident.decide, methods=["POST"]),
        Route("/nodes", routes_nodes.nodes_page),
        Route("/nodes/{node}/resume", routes_nodes.resume, methods=["POST"]),
        Route(
            "/nodes/{node}/lifecycle/{decision}",
            routes_nodes.decide_lifecycle,
            methods=["POST"],
        ),
        Route("/jobs", routes_jobs.jobs_page),
        Route("/jobs/{job_id}", routes_jobs.job_page),
        Route("/scorecard", routes_scorecard.scorecard_page),
        Route("/scorecard/mode", routes_scorecard.change, methods=["POST"]),
        Route("/audit", routes_audit.audit_page),
        Route("/audit.json", routes_audit.audit_json),
        Route("/audit.csv", routes_audit.audit_csv),
        Route("/events", routes_auth.events),
        Route("/login", routes_auth.login_page, methods=["GET"]),
        Route("/login", routes_auth.login, methods=["POST"]),
        Route("/logout", routes_auth.logout, methods=["POST"]),
        Route("/healthz", healthz),
        # Alive whatever PostgreSQL and Temporal do: for a liveness probe that must not restart
        # the console through an outage of either (/healthz is for readiness and alerts).
        Route("/livez", lambda _: PlainTextResponse("ok")),
        *intake.routes(),
        *metrics.routes(),
        Mount("/api/v1", app=create_api(state)),
        Mount("/static", StaticFiles(directory=HERE / "static"), name="static"),
    ]
    app = Starlette(
        routes=routes,
        middleware=[Middleware(SecurityHeaders)],
        exception_handlers={
            Problem: on_problem,
            RelaunchError: on_relaunch_error,
            404: on_http,
            405: on_http,
            Exception: on_error,
        },
        lifespan=lifespan,
    )
    app.state.console = state
    app.state.background = background
    return app
