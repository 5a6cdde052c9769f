"""What every route shares: the console's state, templates, sign-in checks and typed problems."""

from __future__ import annotations

import secrets
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote

from jinja2 import Environment, FileSystemLoader, StrictUndefined, select_autoescape
from starlette.requests import Request
from starlette.responses import HTMLResponse

from relaunch.connectors.slurm.base import Scheduler
from relaunch.console.auth import SESSION_COOKIE, ConsoleRole, Sessions, TokenStore, User
from relaunch.console.kpis import human_duration
from relaunch.console.live import Broadcaster
from relaunch.console.queries import ConsoleDb
from relaunch.models.config import ClusterConfig
from relaunch.models.recovery import Approval, Detection

HERE = Path(__file__).resolve().parent

Decide = Callable[[str, str, Approval], Awaitable[object]]
Deliver = Callable[[Detection], Awaitable[bool]]


class Problem(Exception):
    """An answer other than the page: a 4xx/5xx page (or JSON) with a clear message."""

    status = 400
    title = "Bad request"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class NotSignedIn(Problem):
    status, title = 401, "Sign in required"


class Forbidden(Problem):
    status, title = 403, "Not allowed"


class NotFound(Problem):
    status, title = 404, "Not found"


class Conflict(Problem):
    status, title = 409, "Not possible now"


class Unavailable(Problem):
    status, title = 503, "Unavailable"


@dataclass
class Services:
    """The parts that act: injected by the process entrypoint (and by tests)."""

    decide: Decide | None = None
    scheduler: Scheduler | None = None
    deliver: Deliver | None = None  # signal-with-start of a pushed-in detection (intake)


@dataclass
class Console:
    """Everything a request handler needs, built once per process."""

    config: ClusterConfig
    db: ConsoleDb
    tokens: TokenStore
    sessions: Sessions
    services: Services
    live: Broadcaster
    templates: Environment = field(init=False)

    def __post_init__(self) -> None:
        self.templates = make_templates(self.config)


def workflow_url(config: ClusterConfig, incident: str) -> str:
    """The incident's workflow in the Temporal UI (as `relaunch show` prints it)."""
    ns = quote(config.temporal_namespace, safe="")
    return f"{config.temporal_ui}/namespaces/{ns}/workflows/{quote(incident, safe='')}"


def _when(value: datetime | None) -> str:
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S") if value else "–"


def make_templates(config: ClusterConfig) -> Environment:
    env = Environment(
        loader=FileSystemLoader(HERE / "templates"),
        autoescape=select_autoescape(["html"], default=True),
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["when"] = _when
    env.filters["duration"] = human_duration
    env.globals["workflow_url"] = lambda incident: workflow_url(config, incident)
    env.globals["cluster_name"] = config.name
    return env


def console(request: Request) -> Console:
    state: Console = request.app.state.console
    return state


@dataclass
class Auth:
    """The signed-in user of a request; ``sid`` is None for a Bearer token (no cookie, no CSRF)."""

    user: User
    sid: str | None
    csrf: str

    def context(self) -> dict[str, Any]:
        return {
            "user": self.user,
            "csrf": self.csrf,
            "can_approve": self.user.can(ConsoleRole.APPROVER),
            "can_admin": self.user.can(ConsoleRole.ADMIN),
        }


def authenticate(request: Request) -> Auth | None:
    c = console(request)
    header = request.headers.get("authorization", "")
    if header.lower().startswith("bearer "):
        user = c.tokens.authenticate(header[7:])
        return Auth(user=user, sid=None, csrf="") if user else None
    cookie = request.cookies.get(SESSION_COOKIE)
    if not cookie:
        return None
    loaded = c.sessions.load(cookie)
    if loaded is None:
        return None
    name, sha, sid = loaded
    user = c.tokens.by_hash(name, sha)
    return Auth(user=user, sid=sid, csrf=c.sessions.csrf_token(sid)) if user else None


def require(request: Request, role: ConsoleRole = ConsoleRole.VIEWER) -> Auth:
    auth = authenticate(request)
    if auth is None:
        raise NotSignedIn("sign in with your console token")
    if not auth.user.can(role):
        raise Forbidden(f"this needs the {role.value} role; {auth.user.name} is a {auth.user.role}")
    return auth


async def require_post(request: Request, role: ConsoleRole) -> tuple[Auth, dict[str, str]]:
    """A state-changing form: the role, then the session's CSRF token (Bearer needs none)."""
    auth = require(request, role)
    form = await request.form()
    fields = {k: v for k, v in form.items() if isinstance(v, str)}
    c = console(request)
    if auth.sid is not None and not c.sessions.csrf_ok(auth.sid, fields.get("csrf")):
        raise Forbidden("missing or wrong CSRF token: reload the page and try again")
    return auth, fields


def render(
    request: Request, template: str, auth: Auth | None, status: int = 200, **ctx: Any
) -> HTMLResponse:
    c = console(request)
    base = (
        auth.context()
        if auth
        else {"user": None, "csrf": "", "can_approve": False, "can_admin": False}
    )
    html = c.templates.get_template(template).render({**base, "path": request.url.path, **ctx})
    return HTMLResponse(html, status_code=status)


def nonce() -> str:
    return secrets.token_urlsafe(24)
