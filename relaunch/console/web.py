"""What every route shares: the console's state, the clusters it serves, templates, sign-in and
cluster-scope checks, and typed problems."""

from __future__ import annotations

import secrets
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

from jinja2 import Environment, FileSystemLoader, StrictUndefined, select_autoescape
from starlette.requests import Request
from starlette.responses import HTMLResponse

from relaunch.connectors.slurm.base import Scheduler
from relaunch.console.auth import SESSION_COOKIE, ConsoleRole, Sessions, TokenStore, User
from relaunch.console.kpis import human_duration
from relaunch.console.live import Broadcaster
from relaunch.console.queries import ConsoleDb
from relaunch.models.config import ClusterConfig
from relaunch.models.errors import InvalidNameError
from relaunch.models.lifecycle import RepairReturn
from relaunch.models.names import cluster_name
from relaunch.models.pause import PauseState
from relaunch.models.recovery import Approval, Detection

HERE = Path(__file__).resolve().parent

Decide = Callable[[str, str, Approval], Awaitable[object]]
Deliver = Callable[[Detection], Awaitable[bool]]
# (node, repair) -> the id of the node's lifecycle that was told (signal `returned`).
Repaired = Callable[[str, RepairReturn], Awaitable[str]]


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
    repaired: Repaired | None = None  # a repair callback (intake): the lifecycle's `returned`
    # Raises when the Temporal frontend does not answer (the console's /healthz).
    temporal_health: Callable[[], Awaitable[None]] | None = None


@dataclass
class Cluster:
    """A cluster this console serves: its configuration and what acts on it (its own Slurm,
    its own Temporal decider and delivery)."""

    config: ClusterConfig
    services: Services

    @property
    def name(self) -> str:
        return self.config.name


@dataclass
class Console:
    """Everything a request handler needs, built once per process. ``config`` and ``services``
    are the primary cluster's (the console's own settings come from its configuration);
    ``others`` are the further clusters served over the same PostgreSQL and Temporal."""

    config: ClusterConfig
    db: ConsoleDb
    tokens: TokenStore
    sessions: Sessions
    services: Services
    live: Broadcaster
    others: list[Cluster] = field(default_factory=list)
    # Each served cluster's kill switch, as the background last read it (every page's banner).
    pauses: dict[str, PauseState] = field(default_factory=dict)
    clusters: dict[str, Cluster] = field(init=False)
    templates: Environment = field(init=False)

    def __post_init__(self) -> None:
        primary = Cluster(self.config, self.services)
        self.clusters = {cl.name: cl for cl in (primary, *self.others)}
        self.templates = make_templates(self)

    @property
    def several(self) -> bool:
        """Whether this console serves more than one cluster."""
        return len(self.clusters) > 1

    def config_of(self, cluster: str) -> ClusterConfig:
        """A served cluster's configuration; the primary's for a cluster not served here (its
        incidents share the audit trail and Temporal)."""
        served = self.clusters.get(cluster)
        return served.config if served else self.config

    def served_for(self, user: User) -> list[Cluster]:
        """The served clusters this user sees, the primary first."""
        return [cl for cl in self.clusters.values() if user.sees(cl.name)]


def workflow_url(config: ClusterConfig, incident: str) -> str:
    """The incident's workflow in the Temporal UI (as `relaunch show` prints it)."""
    ns = quote(config.temporal_namespace, safe="")
    return f"{config.temporal_ui}/namespaces/{ns}/workflows/{quote(incident, safe='')}"


def _when(value: datetime | None) -> str:
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S") if value else "–"


def make_templates(c: Console) -> Environment:
    env = Environment(
        loader=FileSystemLoader(HERE / "templates"),
        autoescape=select_autoescape(["html"], default=True),
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["when"] = _when
    env.filters["duration"] = human_duration
    env.globals["workflow_url"] = lambda incident, cluster=None: workflow_url(
        c.config_of(cluster) if cluster else c.config, incident
    )
    env.globals["cluster_name"] = c.config.name
    env.globals["served"] = list(c.clusters)
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


def check_cluster(auth: Auth, cluster: str) -> None:
    """Refuse (403) what belongs to a cluster outside the user's token scope; the message names
    only the clusters the user may see."""
    if not auth.user.sees(cluster):
        raise Forbidden(f"your token is limited to {auth.user.scope}")


def cluster_param(request: Request, auth: Auth) -> str | None:
    """The ``?cluster=`` filter, checked (a bad name is a 400, a cluster outside the user's
    scope a 403), or None when absent."""
    raw = request.query_params.get("cluster", "").strip()
    if not raw:
        return None
    try:
        name = cluster_name(raw)
    except InvalidNameError as exc:
        raise Problem(exc.message) from exc
    check_cluster(auth, name)
    return name


def default_cluster(c: Console, auth: Auth) -> str:
    """The cluster a page of one cluster shows when none is asked for: the first served
    cluster the user sees (the primary for an unscoped user), else the user's first."""
    served = c.served_for(auth.user)
    if served:
        return served[0].name
    return auth.user.clusters[0] if auth.user.clusters else c.config.name


def served_cluster(c: Console, auth: Auth, name: str) -> Cluster:
    """A served cluster the user sees (403 outside the scope, 404 if not served here)."""
    check_cluster(auth, name)
    found = c.clusters.get(name)
    if found is None:
        raise NotFound(f"this console does not serve cluster {name!r}")
    return found


def scope(request: Request, auth: Auth) -> list[str] | None:
    """The clusters a list shows: the ``?cluster=`` filter, else the user's scope (None: every
    cluster, as an unscoped console always showed)."""
    wanted = cluster_param(request, auth)
    return [wanted] if wanted else auth.user.clusters


async def require_post(request: Request, role: ConsoleRole) -> tuple[Auth, dict[str, str]]:
    """A state-changing form: the role, then the session's CSRF token (Bearer needs none)."""
    auth = require(request, role)
    form = await request.form()
    fields = {k: v for k, v in form.items() if isinstance(v, str)}
    c = console(request)
    if auth.sid is not None and not c.sessions.csrf_ok(auth.sid, fields.get("csrf")):
        raise Forbidden("missing or wrong CSRF token: reload the page and try again")
    return auth, fields


_FILTERED_PAGES = ("/", "/jobs", "/nodes", "/audit", "/scorecard")


def cluster_nav(request: Request, auth: Auth) -> list[dict[str, Any]]:
    """The header's cluster filter: each served cluster the user sees, linked to this page
    filtered by it (pages without the filter link to the overview). Empty for one cluster."""
    c = console(request)
    names = [cl.name for cl in c.served_for(auth.user)]
    if len(names) < 2:
        return []
    path = request.url.path
    base = path if path in _FILTERED_PAGES else "/"
    current = request.query_params.get("cluster", "") if path in _FILTERED_PAGES else ""
    if base == "/nodes" and not current:
        current = names[0]  # the nodes page shows one cluster: the first the user sees
    kept = ("window", "since") if base == "/scorecard" else ("window",)
    keep = {k: v for k, v in request.query_params.items() if k in kept and base == path}
    links = [] if base == "/nodes" else [{"name": "all", "href": base, "active": not current}]
    for name in names:
        query = urlencode({**keep, "cluster": name})
        links.append({"name": name, "href": f"{base}?{query}", "active": current == name})
    return links


def render(
    request: Request, template: str, auth: Auth | None, status: int = 200, **ctx: Any
) -> HTMLResponse:
    c = console(request)
    base = (
        {**auth.context(), "cluster_nav": cluster_nav(request, auth)}
        if auth
        else {
            "user": None,
            "csrf": "",
            "can_approve": False,
            "can_admin": False,
            "cluster_nav": [],
        }
    )
    base["several"] = c.several
    base["paused"] = [
        p for p in c.pauses.values() if p.paused and auth is not None and auth.user.sees(p.cluster)
    ]
    html = c.templates.get_template(template).render({**base, "path": request.url.path, **ctx})
    return HTMLResponse(html, status_code=status)


def nonce() -> str:
    return secrets.token_urlsafe(24)
