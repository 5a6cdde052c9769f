"""slurmrestd as a read path (API v0.0.38 of Slurm 22.05, tolerant of newer shapes).

Two ways to authenticate, as slurmrestd offers them:
- local: a unix socket served by ``slurmrestd -a rest_auth/local``; the kernel vouches for the
  caller, no token is sent;
- JWT: ``X-SLURM-USER-NAME`` and ``X-SLURM-USER-TOKEN`` on every request. The token is either
  given, or minted from Slurm's ``jwt_key`` file (HS256, claim ``sun``) and renewed before expiry.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx
import jwt

from relaunch.connectors.slurm import parse
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


class JwtMinter:
    """Mints HS256 tokens the way ``scontrol token`` does, from the cluster's jwt_key file."""

    def __init__(self, key_file: Path, user: str, lifetime_s: int = 1800) -> None:
        self._key = key_file.read_bytes()
        self.user = names.user_name(user)
        self._lifetime = lifetime_s
        self._token = ""
        self._expires = 0.0

    def token(self) -> str:
        now = time.time()
        if now > self._expires - min(60, self._lifetime / 4):
            self._expires = now + self._lifetime
            self._token = jwt.encode(
                {"iat": int(now), "exp": int(self._expires), "sun": self.user},
                self._key,
                algorithm="HS256",
            )
        return self._token


class SlurmRest:
    """Reads jobs and nodes from slurmrestd."""

    def __init__(
        self,
        *,
        base_url: str = "http://localhost",
        socket_path: str | None = None,
        api_version: str = "v0.0.38",
        user: str | None = None,
        token: str | None = None,
        minter: JwtMinter | None = None,
        timeout: float = 10.0,
    ) -> None:
        transport = httpx.AsyncHTTPTransport(uds=socket_path) if socket_path else None
        self._client = httpx.AsyncClient(base_url=base_url, transport=transport, timeout=timeout)
        self._prefix = f"/slurm/{api_version}"
        self._user = user
        self._token = token
        self._minter = minter

    async def aclose(self) -> None:
        await self._client.aclose()

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

    async def _get(self, path: str) -> dict[str, Any]:
        try:
            response = await self._client.get(self._prefix + path, headers=self._headers())
        except httpx.TimeoutException as exc:
            raise SchedulerTimeoutError("slurmrestd did not answer in time") from exc
        except httpx.TransportError as exc:
            raise ControllerUnavailableError(
                f"cannot reach slurmrestd: {exc}", hint="is slurmrestd running at that address?"
            ) from exc
        if response.status_code in (401, 403):
            raise SchedulerError(
                f"slurmrestd refused the request ({response.status_code})",
                hint="check the JWT user and token (or the socket's permissions)",
            )
        data = parse.load_json(response.text, f"slurmrestd {path}") if response.text else {}
        for error in data.get("errors") or []:
            # 22.05 says "errno"; later API versions "error_number" / "error_code".
            number = error.get("errno", error.get("error_number", error.get("error_code")))
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
