"""slurmrestd answers mapped to typed errors, against an in-process mock transport."""

import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import jwt
import pytest

from relaunch.connectors.slurm.rest import JwtMinter, SlurmRest
from relaunch.models.errors import (
    ControllerUnavailableError,
    InvalidNameError,
    JobNotFoundError,
    NodeNotFoundError,
    SchedulerError,
    SchedulerTimeoutError,
)

Handler = Callable[[httpx.Request], httpx.Response]
KEY = b"0123456789abcdef0123456789abcdef-test-jwt-key"


MakeRest = Callable[..., Awaitable[SlurmRest]]


@pytest.fixture
async def make_rest() -> AsyncIterator[MakeRest]:
    """SlurmRest whose HTTP client answers through ``handler`` instead of a server."""
    made: list[SlurmRest] = []

    async def make(handler: Handler, **kwargs: Any) -> SlurmRest:
        rest = SlurmRest(**{"api_version": "v0.0.38", **kwargs})  # the handlers answer as 22.05
        await rest.aclose()  # the real client is replaced before any request
        rest._client = httpx.AsyncClient(
            transport=httpx.MockTransport(handler), base_url="http://x"
        )
        made.append(rest)
        return rest

    yield make
    for rest in made:
        await rest.aclose()


def slurm_error(errno: int, text: str, status: int = 500) -> Handler:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(status, json={"errors": [{"errno": errno, "error": text}]})

    return handler


async def test_unknown_job(make_rest: MakeRest) -> None:
    rest = await make_rest(slurm_error(2017, "Invalid job id specified"))
    with pytest.raises(JobNotFoundError):
        await rest.get_job("999")


async def test_unknown_node(make_rest: MakeRest) -> None:
    rest = await make_rest(slurm_error(2018, "Invalid node name specified"))
    with pytest.raises(NodeNotFoundError):
        await rest.get_node("n99")


async def test_controller_down_behind_slurmrestd(make_rest: MakeRest) -> None:
    rest = await make_rest(slurm_error(1001, "Unable to contact slurm controller"))
    with pytest.raises(ControllerUnavailableError) as info:
        await rest.list_jobs()
    assert info.value.retryable is True
    assert info.value.hint


@pytest.mark.parametrize("status", [401, 403])
async def test_refused_credentials(make_rest: MakeRest, status: int) -> None:
    rest = await make_rest(lambda request: httpx.Response(status, text="Authentication failure"))
    with pytest.raises(SchedulerError) as info:
        await rest.list_nodes()
    assert type(info.value) is SchedulerError
    assert str(status) in str(info.value)
    assert info.value.hint and "token" in info.value.hint
    assert info.value.retryable is False


async def test_other_http_error_carries_slurm_text(make_rest: MakeRest) -> None:
    rest = await make_rest(slurm_error(9999, "something odd", status=500), token="t", user="root")
    with pytest.raises(SchedulerError, match="HTTP 500: something odd") as info:
        await rest.list_jobs()
    assert info.value.hint is not None


async def test_unreachable_slurmrestd(make_rest: MakeRest) -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    rest = await make_rest(refuse)
    with pytest.raises(ControllerUnavailableError) as info:
        await rest.ping()
    assert info.value.retryable is True


async def test_slurmrestd_too_slow(make_rest: MakeRest) -> None:
    def slow(request: httpx.Request) -> httpx.Response:
        raise httpx.ReadTimeout("timed out", request=request)

    rest = await make_rest(slow)
    with pytest.raises(SchedulerTimeoutError) as info:
        await rest.list_jobs()
    assert info.value.retryable is True


async def test_garbage_answer(make_rest: MakeRest) -> None:
    rest = await make_rest(lambda request: httpx.Response(200, text="<html>proxy</html>"))
    with pytest.raises(SchedulerError, match="not JSON"):
        await rest.list_jobs()


async def test_unsafe_ids_never_reach_the_url(make_rest: MakeRest) -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json={})

    rest = await make_rest(handler)
    with pytest.raises(InvalidNameError):
        await rest.get_job("1/../../nodes")
    with pytest.raises(InvalidNameError):
        await rest.get_node("n1?x=1")
    assert seen == []


async def test_minted_token_is_sent(make_rest: MakeRest, tmp_path: Path) -> None:
    key_file = tmp_path / "jwt_hs256.key"
    key_file.write_bytes(KEY)
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json={"pings": [{"hostname": "ctl", "ping": "UP"}]})

    rest = await make_rest(handler, minter=JwtMinter(key_file, "alice"))
    assert await rest.ping() is True
    assert seen[0].url.path == "/slurm/v0.0.38/ping"
    assert seen[0].headers["X-SLURM-USER-NAME"] == "alice"
    claims = jwt.decode(seen[0].headers["X-SLURM-USER-TOKEN"], KEY, algorithms=["HS256"])
    assert claims["sun"] == "alice"


def test_jwt_minter(tmp_path: Path) -> None:
    key_file = tmp_path / "jwt_hs256.key"
    key_file.write_bytes(KEY)
    minter = JwtMinter(key_file, "alice", lifetime_s=600)
    token = minter.token()
    claims = jwt.decode(token, KEY, algorithms=["HS256"])
    assert claims["sun"] == "alice"
    assert claims["exp"] > claims["iat"]
    assert claims["iat"] <= time.time() < claims["exp"]
    assert minter.token() == token  # cached, not re-minted per request
    with pytest.raises(jwt.InvalidSignatureError):
        jwt.decode(token, b"another key, also long enough for HS256", algorithms=["HS256"])


def test_jwt_minter_refuses_unsafe_user(tmp_path: Path) -> None:
    key_file = tmp_path / "jwt_hs256.key"
    key_file.write_bytes(KEY)
    with pytest.raises(InvalidNameError):
        JwtMinter(key_file, "alice\nroot")
