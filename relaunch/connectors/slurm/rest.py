"""slurmrestd as a read path, and for the job actions its API has, on Slurm 22.05 (data parser
v0.0.38) and 24.11 (v0.0.40 to v0.0.42).

The data parser is negotiated: with ``api_version="auto"`` (the default), the first request reads
the server's OpenAPI document and uses the newest version both sides support; a pinned version
is used as given, and a server that does not serve it is a clear error. What differs between
versions is in ``rest_shapes``.

Two ways to authenticate, as slurmrestd offers them:
- local: a unix socket served by ``slurmrestd -a rest_auth/local``; the kernel vouches for the
  caller, no token is sent;
- JWT: ``X-SLURM-USER-NAME`` and ``X-SLURM-USER-TOKEN`` on every request. The token is either
  given, or minted from Slurm's ``jwt_key`` file (HS256, claim ``sun``) and renewed before expiry.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import httpx
import jwt

from relaunch.connectors.slurm import parse, rest_shapes
from relaunch.connectors.slurm.runner import CONTROLLER_HINT
from relaunch.models import names
from relaunch.models.errors import (
    ControllerUnavailableError,
    JobNotFoundError,
    NodeNotFoundError,
    SchedulerError,
    SchedulerTimeoutError,
)
from relaunch.models.scheduler import Job, Node

# slurm_errno values slurmrestd reports in its "errors" array.
_ESLURM_INVALID_JOB_ID = 2017
_ESLURM_INVALID_NODE_NAME = 2018
_SLURM_PROTOCOL_SOCKET_IMPL_TIMEOUT = 5004
_SLURMCTLD_COMMUNICATIONS_CONNECTION_ERROR = 1001

log = logging.getLogger("relaunch.slurmrestd")


class JwtMinter:
    """Mints HS256 tokens the way ``scontrol token`` does, from the cluster's jwt_key file.

    The key is read once, here (a missing or unreadable file fails at start, with its path and
    never its content); ``renew()`` reads it again, so a rotated key is picked up. A token is
    reused until ``renew_before_s`` before it expires (default: a quarter of its lifetime, at
    most 60 s), then a new one is minted."""

    def __init__(
        self,
        key_file: Path,
        user: str,
        lifetime_s: int = 1800,
        *,
        renew_before_s: float | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._key_file = key_file
        self._key = _read_key(key_file)
        self.user = names.user_name(user)
        self._lifetime = lifetime_s
        self._renew_before = (
            min(60.0, lifetime_s / 4) if renew_before_s is None else float(renew_before_s)
        )
        if not 0 <= self._renew_before < lifetime_s:
            raise ValueError("renew_before_s must be at least 0 and less than lifetime_s")
        self._clock = clock
        self._token = ""
        self._expires = 0.0
        self.minted = 0  # how many tokens this minter has made (for logs and tests)

    @property
    def expires_at(self) -> float:
        """When the current token expires (epoch seconds; 0 before the first)."""
        return self._expires

    def token(self) -> str:
        now = self._clock()
        if not self._token or now >= self._expires - self._renew_before:
            self._mint(now)
        return self._token

    def renew(self) -> str:
        """A fresh token now, from the key file as it is now (slurmrestd refused the last)."""
        self._key = _read_key(self._key_file)
        self._mint(self._clock())
        return self._token

    def _mint(self, now: float) -> None:
        self._expires = now + self._lifetime
        self._token = jwt.encode(
            {"iat": int(now), "exp": int(self._expires), "sun": self.user},
            self._key,
            algorithm="HS256",
        )
        self.minted += 1
        log.debug("minted a slurmrestd token for %s, valid for %d s", self.user, self._lifetime)


def _read_key(key_file: Path) -> bytes:
    try:
        key = key_file.read_bytes()
    except OSError as exc:
        raise SchedulerError(
            f"cannot read the slurmrestd JWT key file {key_file}: {exc.strerror}",
            hint="mount Slurm's jwt key (AuthAltParameters=jwt_key=...) readable by this user",
        ) from exc
    if not key:
        raise SchedulerError(f"the slurmrestd JWT key file {key_file} is empty")
    return key


class SlurmRest:
    """Reads jobs and nodes from slurmrestd."""

    def __init__(
        self,
        *,
        base_url: str = "http://localhost",
        socket_path: str | None = None,
        api_version: str = rest_shapes.AUTO,
        user: str | None = None,
        token: str | None = None,
        minter: JwtMinter | None = None,
        timeout: float = 10.0,
    ) -> None:
        transport = httpx.AsyncHTTPTransport(uds=socket_path) if socket_path else None
        self._client = httpx.AsyncClient(base_url=base_url, transport=transport, timeout=timeout)
        if api_version != rest_shapes.AUTO and api_version not in rest_shapes.SUPPORTED:
            raise ValueError(
                f"unsupported slurmrestd api_version {api_version!r}: auto, or one of "
                + ", ".join(rest_shapes.SUPPORTED)
            )
        self._where = socket_path or base_url
        self._pinned = api_version != rest_shapes.AUTO
        self._version: str | None = api_version if self._pinned else None
        self._negotiating = asyncio.Lock()
        self._user = user
        self._token = token
        self._minter = minter

    async def aclose(self) -> None:
        await self._client.aclose()

    @property
    def api_version(self) -> str | None:
        """The data parser in use: the pinned one, or the negotiated one (None before the first
        request of ``auto``)."""
        return self._version

    async def negotiate(self) -> str:
        """The data parser to use: the pinned one, or on the first call of ``auto`` the newest
        one the server's OpenAPI document offers that Relaunch supports (logged once)."""
        if self._version is not None:
            return self._version
        async with self._negotiating:
            if self._version is None:
                offered = await self._offered()
                chosen = rest_shapes.newest_supported(offered)
                if chosen is None:
                    raise SchedulerError(
                        f"slurmrestd at {self._where} offers data parsers "
                        f"{', '.join(offered) or 'none'}; Relaunch supports "
                        f"{', '.join(rest_shapes.SUPPORTED)}",
                        hint="run slurmrestd with an OpenAPI plugin that serves one of them "
                        "(-s openapi/slurmctld on 23.02 and later, openapi/v0.0.38 on 22.05)",
                    )
                log.info(
                    "slurmrestd at %s: using data parser %s (offered: %s)",
                    self._where,
                    chosen,
                    ", ".join(offered),
                )
                self._version = chosen
        return self._version

    async def _offered(self) -> list[str]:
        """The data parsers the server's OpenAPI document lists (``/openapi/v3``, else the
        older ``/openapi``)."""
        for path in ("/openapi/v3", "/openapi"):
            response = await self._authenticated("GET", path, None, {})
            if response.status_code == 404:
                continue
            if response.status_code >= 400:
                raise SchedulerError(
                    f"slurmrestd {path}: HTTP {response.status_code}",
                    hint="set slurmrestd.api_version to the data parser it serves (e.g. v0.0.42) "
                    "to skip reading its OpenAPI document",
                )
            document = parse.load_json(response.text, f"slurmrestd {path}")
            return rest_shapes.offered_versions(document)
        raise SchedulerError(
            f"slurmrestd at {self._where} serves no OpenAPI document (/openapi/v3, /openapi)",
            hint="set slurmrestd.api_version to the data parser it serves (e.g. v0.0.42)",
        )

    async def __aenter__(self) -> SlurmRest:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def _headers(self) -> dict[str, str]:
        if self._minter is not None:
            return {
                "X-SLURM-USER-NAME": self._minter.user,
                "X-SLURM-USER-TOKEN": self._minter.token(),
            }
        if self._token is not None:
            return {"X-SLURM-USER-NAME": self._user or "", "X-SLURM-USER-TOKEN": self._token}
        return {}

    async def _send(
        self, method: str, path: str, body: Mapping[str, object] | None, params: dict[str, str]
    ) -> httpx.Response:
        try:
            return await self._client.request(
                method, path, headers=self._headers(), json=body, params=params
            )
        except httpx.TimeoutException as exc:
            raise SchedulerTimeoutError("slurmrestd did not answer in time") from exc
        except httpx.TransportError as exc:
            raise ControllerUnavailableError(
                f"cannot reach slurmrestd: {exc}", hint="is slurmrestd running at that address?"
            ) from exc

    async def _authenticated(
        self, method: str, path: str, body: Mapping[str, object] | None, params: dict[str, str]
    ) -> httpx.Response:
        """One request; with a minter, a refused token is renewed once and the request sent
        again (and a second refusal is a clear error)."""
        response = await self._send(method, path, body, params)
        if self._minter is not None and _token_refused(response):
            # Expired by a clock step or a suspended process, or the key was rotated: one
            # fresh token (from the key file as it is now), then a clear error.
            log.info(
                "slurmrestd refused the JWT token for %s; minting a new one", self._minter.user
            )
            self._minter.renew()
            response = await self._send(method, path, body, params)
            if _token_refused(response):
                raise SchedulerError(
                    f"slurmrestd refused a freshly minted JWT token for user {self._minter.user}",
                    hint="slurmctld rejects tokens signed with this key: is jwt_key_file the key "
                    "it uses (AuthAltParameters=jwt_key=...), does the user exist, and do this "
                    "host's and slurmctld's clocks agree?",
                )
        return response

    async def _request(
        self,
        method: str,
        path: str,
        body: Mapping[str, object] | None = None,
        params: dict[str, str] | None = None,
    ) -> dict[str, Any]:
        version = await self.negotiate()
        response = await self._authenticated(method, f"/slurm/{version}{path}", body, params or {})
        if response.status_code in (401, 403):
            raise SchedulerError(
                f"slurmrestd refused the request ({response.status_code})",
                hint="check the JWT user and token (or the socket's permissions)",
            )
        if response.status_code == 404 and not response.text.lstrip().startswith("{"):
            # slurmrestd's own "Unable find requested URL": not a path of this data parser.
            raise SchedulerError(
                f"slurmrestd at {self._where} does not serve {method} /slurm/{version}{path}",
                hint=f"slurmrestd.api_version is pinned to {version}, which this slurmrestd "
                "does not offer: set it to auto, or to a version its /openapi/v3 lists"
                if self._pinned
                else None,
            )
        data = parse.load_json(response.text, f"slurmrestd {path}") if response.text else {}
        for error in data.get("errors") or []:
            number = rest_shapes.error_number(error)
            if number == _ESLURM_INVALID_JOB_ID:
                raise JobNotFoundError(f"job not found ({path})")
            if number == _ESLURM_INVALID_NODE_NAME:
                raise NodeNotFoundError(f"node not found ({path})")
            if number in (
                _SLURM_PROTOCOL_SOCKET_IMPL_TIMEOUT,
                _SLURMCTLD_COMMUNICATIONS_CONNECTION_ERROR,
            ):
                raise ControllerUnavailableError(
                    "slurmrestd cannot reach slurmctld", hint=CONTROLLER_HINT
                )
        if response.status_code >= 400:
            detail = (data.get("errors") or [{}])[0].get("error") or response.reason_phrase
            hint = (
                "slurmctld rejected the request; is the JWT token valid and unexpired?"
                if self._minter is not None or self._token is not None
                else None
            )
            raise SchedulerError(
                f"slurmrestd {path}: HTTP {response.status_code}: {detail}", hint=hint
            )
        return data

    async def _get(self, path: str) -> dict[str, Any]:
        return await self._request("GET", path)

    async def ping(self) -> bool:
        data = await self._get("/ping")
        return bool(data.get("pings"))

    async def list_jobs(self) -> list[Job]:
        data = await self._get("/jobs")
        return [parse.job_from_json(raw) for raw in data.get("jobs") or []]

    async def get_job(self, job_id: str) -> Job:
        job_id = names.job_id(job_id)
        data = await self._get(f"/job/{job_id}")
        for raw in data.get("jobs") or []:
            job = parse.job_from_json(raw)
            if job.job_id == job_id:
                return job
        raise JobNotFoundError(f"job {job_id} not found")

    async def list_nodes(self) -> list[Node]:
        data = await self._get("/nodes")
        return [parse.node_from_json(raw) for raw in data.get("nodes") or []]

    async def get_node(self, name: str) -> Node:
        name = names.node_name(name)
        data = await self._get(f"/node/{name}")
        for raw in data.get("nodes") or []:
            node = parse.node_from_json(raw)
            if node.name == name:
                return node
        raise NodeNotFoundError(f"node {name} not found")

    # ------------------------------------------------------------ raw job updates
    # Plain requests; the idempotent, verified actions built on them are in ``composite``.

    async def update_job(self, job_id: str, properties: Mapping[str, object]) -> None:
        """``POST /job/{id}`` with ``{"hold": true}`` and the like (v0.0.38's ``job_properties``,
        v0.0.40+'s ``job_desc_msg``: the same keys for what Relaunch sends). slurmrestd answers
        200 with no errors (and on v0.0.40+ no failed result) when slurmctld accepted it."""
        job_id = names.job_id(job_id)
        data = await self._request("POST", f"/job/{job_id}", body=properties)
        _raise_errors(data, f"update of job {job_id}")

    async def signal_job(self, job_id: str, signal: str = "KILL") -> None:
        """``DELETE /job/{id}``: with KILL (the default) this cancels the job, as scancel does."""
        job_id = names.job_id(job_id)
        if signal not in _SIGNALS:
            raise ValueError(f"unsupported signal {signal!r}")
        data = await self._request("DELETE", f"/job/{job_id}", params={"signal": signal})
        _raise_errors(data, f"signal {signal} to job {job_id}")


_SIGNALS = frozenset({"HUP", "INT", "QUIT", "ABRT", "KILL", "ALRM", "TERM", "USR1", "USR2", "CONT"})


def _raise_errors(data: dict[str, Any], what: str) -> None:
    """A 200 answer may still carry errors (22.05 reports a rejected key that way, v0.0.40+ a
    failed result)."""
    texts = rest_shapes.update_failures(data)
    if texts:
        raise SchedulerError(f"slurmrestd: {what}: {'; '.join(texts)[:300]}")


def _token_refused(response: httpx.Response) -> bool:
    """Whether this answer is slurmrestd (or slurmctld behind it) refusing the token."""
    if response.status_code in (401, 403):
        return True
    if response.status_code < 500:
        return False
    try:
        data = json.loads(response.text)
    except ValueError:
        return False
    errors = data.get("errors") if isinstance(data, dict) else None
    if not errors or not isinstance(errors, list):
        return False
    return all(
        isinstance(e, dict) and rest_shapes.error_number(e) in rest_shapes.TOKEN_REFUSED
        for e in errors
    )
