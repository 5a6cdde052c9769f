"""In-cluster mode without a cluster: the `slurmrestd` and `temporal_tls` sections, JWT renewal,
the REST-backed scheduler's split of work between slurmrestd and the CLI (building Temporal's
TLS from the section: test_temporal_connect.py)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
import jwt
import pytest
from pydantic import ValidationError

from relaunch.connectors.slurm.commands import SlurmCli
from relaunch.connectors.slurm.composite import SlurmRestScheduler
from relaunch.connectors.slurm.factory import close_scheduler, slurm_scheduler
from relaunch.connectors.slurm.rest import JwtMinter, SlurmRest
from relaunch.connectors.slurm.runner import CommandResult
from relaunch.models.config import ClusterConfig
from relaunch.models.endpoints import SlurmRestSettings, TemporalTlsSettings
from relaunch.models.errors import SchedulerError

KEY = b"0123456789abcdef0123456789abcdef-test-jwt-key"


def cluster(**sections: Any) -> ClusterConfig:
    return ClusterConfig.model_validate(
        {"name": "c1", "database_url": "postgresql://x/y", "bundle_dir": "/tmp/b", **sections}
    )


@pytest.fixture
def key_file(tmp_path: Path) -> Path:
    path = tmp_path / "jwt_hs256.key"
    path.write_bytes(KEY)
    return path


# ---------------------------------------------------------------------- configuration


def test_the_sections_the_helm_chart_writes_parse() -> None:
    # Exactly what deploy/helm/relaunch/templates/_helpers.tpl writes in in-cluster mode.
    config = cluster(
        slurmrestd={
            "url": "http://slurmrestd.slurm.svc.cluster.local:6820",
            "user": "relaunch",
            "jwt_key_file": "/etc/relaunch/slurm-jwt/jwt_hs256.key",
        },
        temporal_tls={
            "client_cert": "/etc/relaunch/temporal-tls/tls.crt",
            "client_key": "/etc/relaunch/temporal-tls/tls.key",
            "server_root_ca_cert": "/etc/relaunch/temporal-tls/ca.crt",
            "server_name": "temporal.internal",
        },
    )
    rest = config.slurmrestd
    assert rest is not None and rest.socket_path is None
    assert rest.base_url == "http://slurmrestd.slurm.svc.cluster.local:6820"
    assert (rest.api_version, rest.token_lifetime_s, rest.renew_before_s) == ("auto", 1800, 300)
    assert (
        config.temporal_tls is not None and config.temporal_tls.server_name == "temporal.internal"
    )
    assert cluster().slurmrestd is None and cluster().temporal_tls is None


@pytest.mark.parametrize("url", ["/run/slurmrestd.sock", "unix:/run/slurmrestd.sock"])
def test_a_unix_socket_needs_no_key(url: str) -> None:
    rest = SlurmRestSettings(url=url)
    assert rest.socket_path == "/run/slurmrestd.sock" and rest.base_url == "http://localhost"


@pytest.mark.parametrize(
    ("section", "complaint"),
    [
        ({"url": "http://ctl:6820"}, "needs jwt_key_file"),
        ({"url": "http://ctl:6820", "jwt_key_file": "/k"}, "needs slurmrestd.user"),
        ({"url": "http://u:pw@ctl:6820", "user": "r", "jwt_key_file": "/k"}, "invalid slurmrestd"),
        ({"url": "ctl:6820", "user": "r", "jwt_key_file": "/k"}, "invalid slurmrestd url"),
        ({"url": "/s", "user": "r;rm", "jwt_key_file": "/k"}, "user"),
        ({"url": "/s", "api_version": "0.0.38"}, "api_version"),
        ({"url": "/s", "token_lifetime_s": 60, "renew_before_s": 60}, "renew_before_s"),
        ({"url": "/s", "jwt_key": "inline-secret"}, "Extra inputs"),
    ],
)
def test_bad_slurmrestd_sections_are_refused(section: dict[str, Any], complaint: str) -> None:
    with pytest.raises(ValidationError, match=complaint):
        cluster(slurmrestd=section)


def test_temporal_tls_needs_cert_and_key_together() -> None:
    with pytest.raises(ValidationError, match="go together"):
        TemporalTlsSettings(client_cert="/c.pem")
    assert TemporalTlsSettings(server_root_ca_cert="/ca.pem").client_key is None


# ---------------------------------------------------------------------- JWT renewal


def test_token_is_renewed_before_it_expires(key_file: Path) -> None:
    now = [1_000_000.0]
    minter = JwtMinter(key_file, "relaunch", 10, renew_before_s=3, clock=lambda: now[0])
    first = minter.token()
    claims = jwt.decode(first, KEY, algorithms=["HS256"], options={"verify_exp": False})
    assert claims == {"iat": 1_000_000, "exp": 1_000_010, "sun": "relaunch"}
    now[0] += 6.9
    assert minter.token() == first and minter.minted == 1
    now[0] += 0.1  # 3 s before expiry: a new token
    second = minter.token()
    assert second != first and minter.minted == 2 and minter.expires_at == 1_000_017


def test_renew_reads_a_rotated_key(key_file: Path) -> None:
    minter = JwtMinter(key_file, "relaunch")
    minter.token()
    rotated = b"another key, rotated by the operator, long enough"
    key_file.write_bytes(rotated)
    assert jwt.decode(minter.renew(), rotated, algorithms=["HS256"])["sun"] == "relaunch"


def test_missing_key_fails_at_start_without_its_content(tmp_path: Path) -> None:
    config = cluster(
        slurmrestd={"url": "http://ctl:6820", "user": "r", "jwt_key_file": str(tmp_path / "nope")}
    )
    with pytest.raises(SchedulerError, match="cannot read the slurmrestd JWT key file") as info:
        slurm_scheduler(config)
    assert str(tmp_path / "nope") in str(info.value)


class FakeRestd:
    """slurmrestd 22.05's answers for one job and one node, with a settable token check."""

    def __init__(self) -> None:
        self.requests: list[httpx.Request] = []
        self.accept: set[bytes] = {KEY}
        self.node_state = "IDLE"
        self.job = {
            "job_id": 7,
            "job_state": "PENDING",
            "state_reason": "None",
            "user_name": "root",
            "requeue": True,
            "restart_cnt": 0,
        }

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        token = request.headers.get("X-SLURM-USER-TOKEN", "")
        if not any(_verifies(token, key) for key in self.accept):
            # What 22.05 answers when slurmctld refuses the token.
            return httpx.Response(
                500, json={"errors": [{"error": "Unspecified error", "errno": -1}]}
            )
        path = request.url.path.removeprefix("/slurm/v0.0.38")
        if request.method == "POST" and path == "/job/7":
            hold = json.loads(request.content)["hold"]
            self.job["state_reason"] = "JobHeldAdmin" if hold else "None"
            return httpx.Response(200, json={"errors": []})
        if request.method == "DELETE" and path == "/job/7":
            self.job["job_state"] = "CANCELLED"
            return httpx.Response(200, json={"errors": []})
        if path in ("/job/7", "/jobs"):
            return httpx.Response(200, json={"errors": [], "jobs": [self.job]})
        if path in ("/node/n1", "/nodes"):
            node = {"name": "n1", "state": self.node_state, "state_flags": []}
            return httpx.Response(200, json={"errors": [], "nodes": [node]})
        return httpx.Response(404)


def _verifies(token: str, key: bytes) -> bool:
    try:
        jwt.decode(token, key, algorithms=["HS256"])
    except jwt.PyJWTError:
        return False
    return True


async def rest_on(fake: FakeRestd, minter: JwtMinter) -> SlurmRest:
    rest = SlurmRest(minter=minter, api_version="v0.0.38")  # the fake is 22.05's
    await rest.aclose()  # replaced by the fake before any request
    rest._client = httpx.AsyncClient(transport=httpx.MockTransport(fake), base_url="http://x")
    return rest


async def test_a_refused_token_is_renewed_once(key_file: Path) -> None:
    fake = FakeRestd()
    fake.accept = {b"the cluster's new key, after a rotation, 0123456789"}
    minter = JwtMinter(key_file, "root")
    rest = await rest_on(fake, minter)
    with pytest.raises(SchedulerError, match="refused a freshly minted JWT token") as info:
        await rest.list_nodes()
    assert info.value.hint and "jwt_key" in info.value.hint and not info.value.retryable
    assert len(fake.requests) == 2 and minter.minted == 2
    key_file.write_bytes(next(iter(fake.accept)))  # the operator mounts the rotated key
    assert [n.name for n in await rest.list_nodes()] == ["n1"]
    assert minter.minted == 3 and len(fake.requests) == 4  # refused, re-minted, accepted
    await rest.aclose()


# ---------------------------------------------------------------------- REST + CLI split


class RecordingRunner:
    """Stands in for the Slurm CLI: records argv, and applies a drain or a requeue of job 7 to
    the fake's state."""

    def __init__(self, fake: FakeRestd) -> None:
        self.fake, self.argvs = fake, list[tuple[str, ...]]()

    async def run(
        self, argv: Sequence[str], *, stdin: str | None = None, timeout: float = 30.0
    ) -> CommandResult:
        self.argvs.append(tuple(argv))
        if argv[:2] == ["scontrol", "update"] and "State=DRAIN" in argv:
            self.fake.node_state = "IDLE+DRAIN"
        if argv[:2] == ["scontrol", "requeue"] and "7" in argv[2].split(","):
            restarts = int(str(self.fake.job["restart_cnt"]))
            self.fake.job.update(job_state="PENDING", restart_cnt=restarts + 1)
        return CommandResult(tuple(argv), 0, "", "", 0.0)


async def test_reads_and_hold_release_cancel_go_over_rest_drain_over_the_cli(
    key_file: Path,
) -> None:
    fake = FakeRestd()
    runner = RecordingRunner(fake)
    sched = SlurmRestScheduler(await rest_on(fake, JwtMinter(key_file, "root")), runner=runner)

    drained = await sched.drain_node("n1", "xid 79")
    assert drained.changed and drained.after.startswith("IDLE") and "DRAIN" in drained.after
    assert runner.argvs == [("scontrol", "update", "NodeName=n1", "State=DRAIN", "Reason=xid 79")]
    assert not (await sched.drain_node("n1", "xid 79")).changed  # idempotent: nothing ran
    assert len(runner.argvs) == 1

    assert (await sched.hold_job("7")).changed and not (await sched.hold_job("7")).changed
    assert (await sched.release_job("7")).changed and not (await sched.release_job("7")).changed
    assert (await sched.cancel_job("7")).changed and not (await sched.cancel_job("7")).changed
    assert len(runner.argvs) == 1  # no squeue, sinfo, scontrol hold/release, scancel

    calls = [(r.method, r.url.path.removeprefix("/slurm/v0.0.38")) for r in fake.requests]
    assert calls[:2] == [("GET", "/node/n1"), ("GET", "/node/n1")]  # before, verify
    assert [json.loads(r.content) for r in fake.requests if r.method == "POST"] == [
        {"hold": True},
        {"hold": False},
    ]
    deletes = [r for r in fake.requests if r.method == "DELETE"]
    assert len(deletes) == 1 and deletes[0].url.params["signal"] == "KILL"
    await sched.aclose()


async def test_a_batch_requeue_reads_over_rest_and_requeues_over_the_cli(
    key_file: Path,
) -> None:
    fake = FakeRestd()
    fake.job["job_state"] = "RUNNING"
    runner = RecordingRunner(fake)
    sched = SlurmRestScheduler(await rest_on(fake, JwtMinter(key_file, "root")), runner=runner)

    results = await sched.requeue_jobs({"7": 0, "8": 0})
    assert {j: (r.changed, r.note) for j, r in results.items()} == {
        "7": (True, ""),
        "8": (False, "not found"),
    }
    assert runner.argvs == [("scontrol", "requeue", "7")]  # no squeue: reads are REST's
    calls = [(r.method, r.url.path.removeprefix("/slurm/v0.0.38")) for r in fake.requests]
    assert calls == [("GET", "/jobs"), ("GET", "/jobs")]  # before, verify
    assert not (await sched.requeue_jobs({"7": 0}))["7"].changed  # retried: nothing runs
    assert len(runner.argvs) == 1
    await sched.aclose()


async def test_the_factory_picks_the_backend(key_file: Path) -> None:
    plain = slurm_scheduler(cluster(slurm_conf="/etc/slurm/slurm.conf"))
    assert type(plain) is SlurmCli
    config = cluster(
        slurmrestd={"url": "http://ctl:6820", "user": "root", "jwt_key_file": str(key_file)}
    )
    sched = slurm_scheduler(config)
    assert isinstance(sched, SlurmRestScheduler)
    await close_scheduler(sched)
    await close_scheduler(plain)
