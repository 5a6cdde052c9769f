"""Who may use the console: tokens with roles and cluster scopes, signed session cookies, CSRF
tokens.

Only SHA-256 hashes of tokens are stored (the tokens file). A user signs in once with a token and
gets a signed, HttpOnly, SameSite=Strict session cookie; scripts send ``Authorization: Bearer``.
Every form POST of a cookie session carries a CSRF token bound to that session by an HMAC. A
token may be limited to some clusters (``clusters``); without that field it sees every cluster.
An intake token may be trusted with node-health events (``trusted_health``): what it sends
then convicts a node like the node's own kernel log (docs/trust.md).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
import tempfile
from collections.abc import Collection
from enum import StrEnum
from pathlib import Path

from itsdangerous import BadSignature, URLSafeTimedSerializer
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    TypeAdapter,
    ValidationError,
    field_validator,
    model_validator,
)

from relaunch.connectors.operator_files import operator_file_problem
from relaunch.models import names
from relaunch.models.errors import InvalidNameError, RelaunchError
from relaunch.models.names import cluster_name

SESSION_COOKIE = "relaunch_session"
SESSION_MAX_AGE_S = 12 * 3600


class ConsoleRole(StrEnum):
    """Viewer < approver < admin: each may do what the ones before it may. ``intake`` and
    ``repair`` stand apart: machine senders that no person's role includes. An intake sender
    (Alertmanager, a Slurm hook, a health checker) may push signals in and nothing else; a
    repair sender may only say that a node is repaired (``POST /intake/repair``), which an
    intake token may not."""

    VIEWER = "viewer"
    APPROVER = "approver"
    ADMIN = "admin"
    INTAKE = "intake"
    REPAIR = "repair"
    AGENT = "agent"  # one node's agent (POST /intake/agent): the token's name is the node

    @property
    def rank(self) -> int:
        return _RANK[self]

    @property
    def machine(self) -> bool:
        """A machine sender's role (intake, repair): it allows only itself."""
        return self in (ConsoleRole.INTAKE, ConsoleRole.REPAIR, ConsoleRole.AGENT)

    def allows(self, needed: ConsoleRole) -> bool:
        if self.machine or needed.machine:
            return self is needed
        return self.rank >= needed.rank


_RANK = {
    ConsoleRole.INTAKE: 0,
    ConsoleRole.REPAIR: 0,
    ConsoleRole.AGENT: 0,
    ConsoleRole.VIEWER: 1,
    ConsoleRole.APPROVER: 2,
    ConsoleRole.ADMIN: 3,
}


def _scope(value: list[str] | None) -> list[str] | None:
    """A cluster scope: None (every cluster) or a non-empty list of valid cluster names."""
    if value is None:
        return None
    if not value:
        raise ValueError("clusters must name at least one cluster (leave it out for every cluster)")
    try:
        return list(dict.fromkeys(cluster_name(c) for c in value))
    except InvalidNameError as exc:
        raise ValueError(exc.message) from exc


class TokenEntry(BaseModel):
    """One line of the tokens file: a name, a role, the SHA-256 of the token (hex), the
    clusters the token is limited to (absent: every cluster), and, for an intake token,
    whether its node-health events are trusted evidence (absent: they are not)."""

    model_config = ConfigDict(extra="forbid")  # a misspelt `trusted_heath` is an error

    name: str
    role: ConsoleRole
    sha256: str
    clusters: list[str] | None = None
    trusted_health: bool = Field(
        default=False,
        description="an intake token's health events (POST /intake/health) convict a node, as "
        "the node's own kernel log does; without it they may only point at one",
    )

    @field_validator("clusters")
    @classmethod
    def _clusters(cls, value: list[str] | None) -> list[str] | None:
        return _scope(value)

    @model_validator(mode="after")
    def _intake_only(self) -> TokenEntry:
        if self.trusted_health and self.role is not ConsoleRole.INTAKE:
            raise ValueError(f"trusted_health is for intake tokens, not a {self.role.value}'s")
        if self.role is ConsoleRole.AGENT:
            # A node's agent token is named after its node: what it sends is that node's.
            try:
                names.node_name(self.name)
            except InvalidNameError as exc:
                raise ValueError(f"an agent token is named after its node: {exc.message}") from exc
        return self

    def user(self, sha256: str) -> User:
        return User(
            name=self.name,
            role=self.role,
            sha256=sha256,
            clusters=self.clusters,
            trusted_health=self.trusted_health,
        )


class User(BaseModel):
    """A signed-in person (the name goes into the audit trail), limited to ``clusters`` when
    the token names some."""

    name: str
    role: ConsoleRole
    sha256: str
    clusters: list[str] | None = None
    trusted_health: bool = False  # TokenEntry.trusted_health

    def can(self, needed: ConsoleRole) -> bool:
        return self.role.allows(needed)

    def sees(self, cluster: str) -> bool:
        """Whether this user may see (and, with the role, act on) ``cluster``."""
        return self.clusters is None or cluster in self.clusters

    @property
    def scope(self) -> str:
        """The clusters this user sees, in words (for a refusal)."""
        if self.clusters is None:
            return "every cluster"
        noun = "cluster" if len(self.clusters) == 1 else "clusters"
        return f"{noun} {', '.join(self.clusters)}"


class TokensFileError(RelaunchError):
    """The console's tokens file is missing or malformed."""


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def new_token() -> str:
    return "rl_" + secrets.token_urlsafe(32)


_ENTRIES = TypeAdapter(list[TokenEntry])


class TokenStore:
    """The tokens file, re-read when it changes (removing a line revokes that token at once)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._mtime: float | None = None
        self._entries: list[TokenEntry] = []
        self._load()

    def _load(self) -> None:
        try:
            st = self.path.stat()
            mtime = st.st_mtime
            if mtime == self._mtime:
                return
            # Whoever may write the file may give themselves any role (trusted_health too).
            problem = operator_file_problem(str(self.path), st)
            if problem:
                raise TokensFileError(
                    f"refusing the console tokens file: {problem}",
                    hint="chown root (or the service's account) and chmod 0600 the file, in a "
                    "directory only root may write",
                )
            entries = _ENTRIES.validate_json(self.path.read_bytes())
        except OSError as exc:
            raise TokensFileError(
                f"cannot read the console tokens file {self.path}: {exc.strerror}",
                hint="set console.tokens_file in the cluster configuration",
            ) from exc
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"])
            raise TokensFileError(
                f"{self.path}: not a JSON list of "
                "{name, role, sha256[, clusters][, trusted_health]}: "
                + (f"{where}: " if where else "")
                + str(first["msg"]).removeprefix("Value error, ")
            ) from exc
        self._entries, self._mtime = entries, mtime

    def entries(self) -> list[TokenEntry]:
        self._load()
        return list(self._entries)

    def authenticate(self, token: str) -> User | None:
        """The user this token belongs to, or None. Compares every hash in constant time."""
        digest = hash_token(token.strip())
        found: User | None = None
        for entry in self.entries():
            if hmac.compare_digest(entry.sha256.lower(), digest):
                found = entry.user(entry.sha256.lower())
        return found

    def by_hash(self, name: str, sha256: str) -> User | None:
        """The session's user if their token is still in the file."""
        for entry in self.entries():
            if entry.name == name and hmac.compare_digest(entry.sha256.lower(), sha256):
                return entry.user(sha256)
        return None


def write_tokens(
    path: Path,
    users: list[tuple[str, ConsoleRole]],
    clusters: dict[str, list[str]] | None = None,
    trusted_health: Collection[str] = (),
) -> dict[str, str]:
    """Create a tokens file for these (name, role) pairs; returns {name: plaintext token}.

    ``clusters`` limits the named users to those clusters; everyone else sees every cluster
    (their lines carry no ``clusters`` field, as files written before scopes). The intake
    senders named in ``trusted_health`` are trusted with node-health events."""
    scopes = clusters or {}
    unknown = (set(scopes) | set(trusted_health)) - {name for name, _ in users}
    if unknown:
        raise ValueError(f"settings for users not in the list: {', '.join(sorted(unknown))}")
    tokens = {name: new_token() for name, _ in users}
    entries = [
        _line(
            TokenEntry(
                name=name,
                role=role,
                sha256=hash_token(tokens[name]),
                clusters=scopes.get(name),
                trusted_health=name in trusted_health,
            )
        )
        for name, role in users
    ]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(entries, indent=2) + "\n")
    return tokens


def _line(entry: TokenEntry) -> dict[str, object]:
    """A line of the tokens file: fields at their default are left out, as in files written
    before they existed."""
    return entry.model_dump(mode="json", exclude_none=True, exclude_defaults=True)


def add_token(
    path: Path,
    name: str,
    role: ConsoleRole,
    *,
    clusters: list[str] | None = None,
    trusted_health: bool = False,
) -> str:
    """Add a token for ``name`` to the tokens file (created if missing; a name already in it
    is refused) and return it in plain text: the file keeps its hash only. The console reads
    the file again when it changes."""
    entries = TokenStore(path).entries() if path.exists() else []
    if any(e.name == name for e in entries):
        raise ValueError(f"{path} already has a token named {name!r}")
    token = new_token()
    try:
        entry = TokenEntry(
            name=name,
            role=role,
            sha256=hash_token(token),
            clusters=clusters,
            trusted_health=trusted_health,
        )
    except ValidationError as exc:
        raise ValueError(str(exc.errors()[0]["msg"]).removeprefix("Value error, ")) from exc
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps([_line(e) for e in [*entries, entry]], indent=2) + "\n"
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w") as out:
        out.write(text)
    os.replace(tmp, path)
    return token


class Sessions:
    """Signs and reads session cookies; derives each session's CSRF token."""

    def __init__(self, secret: str) -> None:
        self._secret = secret.encode()
        self._serializer = URLSafeTimedSerializer(secret, salt="relaunch-console-session")

    def dump(self, user: User) -> str:
        return self._serializer.dumps(
            {"name": user.name, "sha256": user.sha256, "sid": secrets.token_urlsafe(16)}
        )

    def load(self, cookie: str) -> tuple[str, str, str] | None:
        """(name, sha256, session id) of a valid, unexpired cookie, else None."""
        try:
            data = self._serializer.loads(cookie, max_age=SESSION_MAX_AGE_S)
        except BadSignature:
            return None
        if not isinstance(data, dict):
            return None
        name, sha, sid = data.get("name"), data.get("sha256"), data.get("sid")
        if not (isinstance(name, str) and isinstance(sha, str) and isinstance(sid, str)):
            return None
        return name, sha, sid

    def csrf_token(self, sid: str) -> str:
        return hmac.new(self._secret, f"csrf:{sid}".encode(), hashlib.sha256).hexdigest()

    def csrf_ok(self, sid: str, token: str | None) -> bool:
        return bool(token) and hmac.compare_digest(self.csrf_token(sid), str(token))

    def login_csrf_ok(self, cookie: str | None, form: str | None) -> bool:
        """The sign-in form has no session yet: a double-submit nonce (cookie == field)."""
        return bool(cookie) and bool(form) and hmac.compare_digest(str(cookie), str(form))
