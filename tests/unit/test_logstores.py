"""Loki and VictoriaLogs connectors against stand-ins that speak the documented HTTP APIs."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from pydantic import ValidationError

from relaunch.connectors.bundles import read_bundle, write_bundle
from relaunch.connectors.logstores import (
    LogSelector,
    LokiStore,
    VictoriaLogsStore,
    fetch_evidence_logs,
    job_selector,
    node_selector,
    open_log_store,
)
from relaunch.models.bundle import BundleJob
from relaunch.models.config import ClusterConfig
from relaunch.models.errors import (
    InvalidNameError,
    LogQueryError,
    LogStoreAuthError,
    LogStoreError,
    LogStoreUnavailableError,
)
from relaunch.models.logstore import LogBackend, LogStoreSettings, render_template
from relaunch.models.scheduler import Job
from tests.support.logservers import LokiStandIn, VictoriaLogsStandIn, serve

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
NS0 = int(T0.timestamp()) * 1_000_000_000
SEC = 1_000_000_000
JOB_QUERY = '{cluster="{cluster}", slurm_job_id="{job_id}"}'
NODE_QUERY = '{host="{node}", unit="kernel"}'
SECRET = "s3cret-token-0123456789"


@pytest.fixture
def loki() -> Iterator[LokiStandIn]:
    server = LokiStandIn()
    for _ in serve(server):
        yield server


@pytest.fixture
def vlogs() -> Iterator[VictoriaLogsStandIn]:
    server = VictoriaLogsStandIn()
    for _ in serve(server):
        yield server


def settings(backend: str, url: str, **extra: object) -> LogStoreSettings:
    queries = (
        {"job_query": JOB_QUERY, "node_query": NODE_QUERY}
        if backend == "loki"
        else {"job_query": 'slurm_job_id:="{job_id}"', "node_query": '{host="{node}"}'}
    )
    return LogStoreSettings.model_validate({"backend": backend, "url": url, **queries, **extra})


def job_sel(s: LogStoreSettings, job_id: str = "418227") -> LogSelector:
    return job_selector(s, "dev", job_id)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# ----------------------------------------------------------------------------------- Loki


async def test_loki_pages_across_the_limit_boundary(loki: LokiStandIn) -> None:
    # 25 lines; three share the timestamp where the first page of 10 ends
    stamps = [NS0 + i * SEC for i in range(25)]
    stamps[10] = stamps[11] = stamps[9]
    loki.push(
        {"cluster": "dev", "slurm_job_id": "418227"},
        [(ts, f"line {i}") for i, ts in enumerate(stamps)],
    )
    s = settings("loki", loki.url, page_size=10)
    async with LokiStore(s, environ={}) as store:
        lines = await store.fetch(job_sel(s), T0, T0 + timedelta(minutes=1), 100)
        newest = await store.fetch(job_sel(s), T0, T0 + timedelta(minutes=1), 7, newest=True)
        first = await store.fetch(job_sel(s), T0, T0 + timedelta(minutes=1), 12)
    assert [line.text for line in lines] == [f"line {i}" for i in range(25)]
    assert [line.text for line in newest] == [f"line {i}" for i in range(18, 25)]
    assert [line.text for line in first] == [f"line {i}" for i in range(12)]
    calls = [r.params for r in loki.requests]
    assert all(int(c["limit"]) <= 10 for c in calls)
    assert calls[0]["direction"] == "forward" and calls[0]["start"] == str(NS0)
    assert calls[0]["query"] == JOB_QUERY.replace("{cluster}", "dev").replace("{job_id}", "418227")
    assert len([c for c in calls if c["direction"] == "forward"]) >= 3


async def test_loki_merges_streams_in_time_order(loki: LokiStandIn) -> None:
    job = {"cluster": "dev", "slurm_job_id": "7"}
    loki.push({**job, "rank": "0"}, [(NS0 + 0, "r0 a"), (NS0 + 2 * SEC, "r0 b")])
    loki.push({**job, "rank": "1"}, [(NS0 + SEC, "r1 a"), (NS0 + 3 * SEC, "r1 b")])
    loki.push({"cluster": "dev", "slurm_job_id": "8"}, [(NS0 + SEC, "other job")])
    s = settings("loki", loki.url)
    async with LokiStore(s, environ={}) as store:
        lines = await store.fetch(job_sel(s, "7"), T0, T0 + timedelta(seconds=10), 100)
    assert [line.text for line in lines] == ["r0 a", "r1 a", "r0 b", "r1 b"]
    assert lines[1].labels["rank"] == "1"
    assert lines[1].time == T0 + timedelta(seconds=1)


async def test_loki_line_filter_is_an_escaped_literal(loki: LokiStandIn) -> None:
    loki.push(
        {"cluster": "dev", "slurm_job_id": "7"},
        [(NS0, 'he said "hi" \\o/'), (NS0 + 1, "he said hi")],
    )
    s = settings("loki", loki.url)
    selector = job_selector(s, "dev", "7", contains='said "hi" \\o/')
    async with LokiStore(s, environ={}) as store:
        lines = await store.fetch(selector, T0, T0 + timedelta(seconds=1), 10)
    assert [line.text for line in lines] == ['he said "hi" \\o/']


async def test_loki_tenants_are_isolated() -> None:
    server = LokiStandIn(multi_tenant=True)
    labels = {"cluster": "dev", "slurm_job_id": "7"}
    server.push(labels, [(NS0, "team a")], tenant="team-a")
    server.push(labels, [(NS0, "team b")], tenant="team-b")
    for url in serve(server):
        s = settings("loki", url, tenant="team-a")
        async with LokiStore(s, environ={}) as store:
            lines = await store.fetch(job_sel(s, "7"), T0, T0 + timedelta(seconds=1), 10)
        assert [line.text for line in lines] == ["team a"]
        assert server.requests[-1].headers["x-scope-orgid"] == "team-a"
        s = settings("loki", url)
        async with LokiStore(s, environ={}) as store:
            with pytest.raises(LogStoreAuthError, match="no org id"):
                await store.fetch(job_sel(s, "7"), T0, T0 + timedelta(seconds=1), 10)


async def test_refused_credentials_are_a_clear_error_without_the_secret() -> None:
    server = LokiStandIn(token=SECRET)
    server.push({"cluster": "dev", "slurm_job_id": "7"}, [(NS0, "ok")])
    for url in serve(server):
        s = settings("loki", url, token_env="RELAUNCH_LOKI_TOKEN")
        wrong = "wrong-" + SECRET
        async with LokiStore(s, environ={"RELAUNCH_LOKI_TOKEN": wrong}) as store:
            with pytest.raises(LogStoreAuthError) as info:
                await store.fetch(job_sel(s, "7"), T0, T0 + timedelta(seconds=1), 10)
        assert info.value.retryable is False
        assert "401" in str(info.value) and info.value.hint
        assert wrong not in str(info.value) and SECRET not in str(info.value)
        async with LokiStore(s, environ={"RELAUNCH_LOKI_TOKEN": SECRET}) as store:
            lines = await store.fetch(job_sel(s, "7"), T0, T0 + timedelta(seconds=1), 10)
        assert [line.text for line in lines] == ["ok"]
        assert server.requests[-1].headers["authorization"] == f"Bearer {SECRET}"


async def test_basic_auth() -> None:
    server = LokiStandIn(basic=("relaunch", SECRET))
    server.push({"cluster": "dev", "slurm_job_id": "7"}, [(NS0, "ok")])
    for url in serve(server):
        s = settings("loki", url, username="relaunch", password_env="LOKI_PASSWORD")
        async with LokiStore(s, environ={"LOKI_PASSWORD": SECRET}) as store:
            lines = await store.fetch(job_sel(s, "7"), T0, T0 + timedelta(seconds=1), 10)
        assert [line.text for line in lines] == ["ok"]
        async with LokiStore(s, environ={"LOKI_PASSWORD": "nope-nope"}) as store:
            with pytest.raises(LogStoreAuthError) as info:
                await store.fetch(job_sel(s, "7"), T0, T0 + timedelta(seconds=1), 10)
        assert "nope-nope" not in str(info.value)


def test_missing_secret_names_the_variable_only() -> None:
    s = settings("loki", "http://127.0.0.1:1", token_env="RELAUNCH_LOKI_TOKEN")
    with pytest.raises(LogStoreError, match="RELAUNCH_LOKI_TOKEN is not set") as info:
        LokiStore(s, environ={})
    assert info.value.retryable is False


@pytest.mark.parametrize("status", [500, 502, 503, 429])
async def test_server_errors_are_retryable(loki: LokiStandIn, status: int) -> None:
    loki.fail_next = [status]
    s = settings("loki", loki.url)
    async with LokiStore(s, environ={}) as store:
        with pytest.raises(LogStoreUnavailableError) as info:
            await store.fetch(job_sel(s), T0, T0 + timedelta(seconds=1), 10)
    assert info.value.retryable is True
    assert str(status) in str(info.value)


@pytest.mark.parametrize("backend", ["loki", "victorialogs"])
async def test_connection_refused_is_retryable(backend: str) -> None:
    s = settings(backend, f"http://127.0.0.1:{free_port()}")
    store = open_log_store(s, environ={})
    assert store is not None
    async with store:
        with pytest.raises(LogStoreUnavailableError) as info:
            await store.fetch(job_sel(s), T0, T0 + timedelta(seconds=1), 10)
    assert info.value.retryable is True
    assert "cannot reach" in str(info.value)


async def test_bad_query_shows_lokis_text_and_is_not_retried(loki: LokiStandIn) -> None:
    s = settings("loki", loki.url, job_query='{slurm_job_id="{job_id}"} | badstage')
    async with LokiStore(s, environ={}) as store:
        with pytest.raises(LogQueryError) as info:
            await store.fetch(job_sel(s), T0, T0 + timedelta(seconds=1), 10)
    assert info.value.retryable is False
    assert "parse error" in str(info.value)


@pytest.mark.parametrize("node", ['n1"} |= "x', "n1\\", 'n1", host=~".*', "n1 or *", ""])
def test_node_names_cannot_inject_query_syntax(node: str) -> None:
    for backend in ("loki", "victorialogs"):
        with pytest.raises(InvalidNameError):
            node_selector(settings(backend, "http://x"), "dev", node)


@pytest.mark.parametrize("job_id", ['1"} or {x="', "418227 | limit 1", "abc"])
def test_job_ids_cannot_inject_query_syntax(job_id: str) -> None:
    with pytest.raises(InvalidNameError):
        job_selector(settings("loki", "http://x"), "dev", job_id)


def test_template_rendering() -> None:
    assert render_template(NODE_QUERY, cluster="dev", node="gpu-01.rack2") == (
        '{host="gpu-01.rack2", unit="kernel"}'
    )
    assert render_template(JOB_QUERY, cluster="dev", job_id="12_3") == (
        '{cluster="dev", slurm_job_id="12_3"}'
    )


# --------------------------------------------------------------------------- configuration


def cluster(**logs: object) -> ClusterConfig:
    return ClusterConfig.model_validate(
        {"name": "dev", "database_url": "postgresql:///x", "bundle_dir": "/tmp/b", "logs": logs}
    )


def test_config_defaults_to_files() -> None:
    config = ClusterConfig(name="dev", database_url="postgresql:///x", bundle_dir="/tmp/b")
    assert config.logs.backend is LogBackend.FILES
    assert open_log_store(config.logs) is None


def test_config_loki_section() -> None:
    config = cluster(
        backend="loki",
        url="https://loki.example:3100",
        tenant="hpc",
        token_env="RELAUNCH_LOKI_TOKEN",
        job_query=JOB_QUERY,
        node_query=NODE_QUERY,
        timeout_s=5,
    )
    assert config.logs.backend is LogBackend.LOKI and config.logs.tenant == "hpc"
    store = open_log_store(config.logs, environ={"RELAUNCH_LOKI_TOKEN": SECRET})
    assert isinstance(store, LokiStore)


@pytest.mark.parametrize(
    ("logs", "message"),
    [
        ({"backend": "loki", "job_query": JOB_QUERY}, "url must be"),
        ({"backend": "loki", "url": "http://u:pw@loki:3100", "job_query": JOB_QUERY}, "url must"),
        ({"backend": "loki", "url": "http://loki:3100"}, "job_query is required"),
        ({"backend": "loki", "url": "http://l", "job_query": "{job={job_id}}"}, "double-quoted"),
        ({"backend": "loki", "url": "http://l", "job_query": '{j="x"}'}, "must contain {job_id}"),
        ({"backend": "loki", "url": "http://l", "job_query": '{j="{job_id}'}, "unterminated"),
        (
            {"backend": "loki", "url": "http://l", "job_query": JOB_QUERY, "node_query": "{}"},
            "node_query must contain {node}",
        ),
        (
            {"backend": "loki", "url": "http://l", "job_query": JOB_QUERY, "username": "u"},
            "go together",
        ),
        (
            {
                "backend": "loki",
                "url": "http://l",
                "job_query": JOB_QUERY,
                "token_env": "T",
                "username": "u",
                "password_env": "P",
            },
            "not both",
        ),
        (
            {"backend": "victorialogs", "url": "http://v", "job_query": 'j:="{job_id}" | limit 1'},
            "without `|` pipes",
        ),
        (
            {"backend": "victorialogs", "url": "http://v", "job_query": JOB_QUERY, "tenant": "x"},
            "tenant must match",
        ),
        ({"backend": "elastic"}, "backend"),
    ],
)
def test_config_errors_are_clear(logs: dict[str, object], message: str) -> None:
    with pytest.raises(ValidationError, match="logs") as info:
        cluster(**logs)
    assert message in str(info.value)


@pytest.mark.parametrize(
    "mistake",
    [
        {"token": SECRET},
        {"password": SECRET},
        {"token_env": SECRET + "-x.y"},
        {"url": f"https://relaunch:{SECRET}@loki:3100"},
    ],
)
def test_a_secret_written_into_the_file_is_refused_and_not_echoed(
    mistake: dict[str, str],
) -> None:
    logs = {"backend": "loki", "url": "http://l", "job_query": JOB_QUERY, **mistake}
    with pytest.raises(ValidationError) as info:
        cluster(**logs)
    assert next(iter(mistake)) in str(info.value)
    assert SECRET not in str(info.value)


# --------------------------------------------------------------------------- VictoriaLogs


async def test_victorialogs_newest_and_first_lines(vlogs: VictoriaLogsStandIn) -> None:
    vlogs.ingest(
        {"host": "n1"},
        [(NS0 + i * SEC, f"step {i}") for i in range(10)],
        fields={"slurm_job_id": "418227"},
    )
    vlogs.ingest({"host": "n2"}, [(NS0, "other job")], fields={"slurm_job_id": "5"})
    s = settings("victorialogs", vlogs.url)
    async with VictoriaLogsStore(s, environ={}) as store:
        newest = await store.fetch(job_sel(s), T0, T0 + timedelta(minutes=1), 3, newest=True)
        first = await store.fetch(job_sel(s), T0, T0 + timedelta(minutes=1), 3)
        window = await store.fetch(
            job_sel(s), T0 + timedelta(seconds=5), T0 + timedelta(hours=1), 99
        )
    assert [line.text for line in newest] == ["step 7", "step 8", "step 9"]
    assert [line.text for line in first] == ["step 0", "step 1", "step 2"]
    assert [line.text for line in window] == [f"step {i}" for i in range(5, 10)]
    assert newest[0].time == T0 + timedelta(seconds=7)
    assert newest[0].labels["host"] == "n1" and newest[0].labels["_stream"] == '{host="n1"}'
    sent = vlogs.requests[0]
    assert sent.method == "POST" and sent.params["limit"] == "3"
    assert sent.params["query"].startswith("_time:[2026-03-01T12:00:00.000000Z, ")
    assert '(slurm_job_id:="418227")' in sent.params["query"]


async def test_victorialogs_node_stream_phrase_and_tenant() -> None:
    server = VictoriaLogsStandIn()
    server.ingest({"host": "n1"}, [(NS0, "NVRM: Xid 79, GPU has fallen off the bus")])
    server.ingest({"host": "n1"}, [(NS0 + 1, "NVRM: Xid 79 at tenant 12")], tenant=("12", "0"))
    server.ingest({"host": "n10"}, [(NS0, "NVRM: Xid 48")])
    for url in serve(server):
        s = settings("victorialogs", url)
        selector = node_selector(s, "dev", "n1", contains="Xid 79,")
        assert selector is not None
        async with VictoriaLogsStore(s, environ={}) as store:
            lines = await store.fetch(selector, T0, T0 + timedelta(seconds=1), 10)
        assert [line.text for line in lines] == ["NVRM: Xid 79, GPU has fallen off the bus"]
        s = settings("victorialogs", url, tenant="12")
        async with VictoriaLogsStore(s, environ={}) as store:
            lines = await store.fetch(
                node_selector(s, "dev", "n1") or selector, T0, T0 + timedelta(seconds=1), 10
            )
        assert [line.text for line in lines] == ["NVRM: Xid 79 at tenant 12"]
        assert server.requests[-1].headers["accountid"] == "12"


async def test_victorialogs_bad_query_and_server_error(vlogs: VictoriaLogsStandIn) -> None:
    s = settings("victorialogs", vlogs.url, job_query='slurm_job_id:="{job_id}" or x')
    async with VictoriaLogsStore(s, environ={}) as store:
        with pytest.raises(LogQueryError, match="cannot parse query"):
            await store.fetch(job_sel(s), T0, T0 + timedelta(seconds=1), 10)
        vlogs.fail_next = [503]
        with pytest.raises(LogStoreUnavailableError):
            await store.fetch(job_sel(s), T0, T0 + timedelta(seconds=1), 10)


# ------------------------------------------------------------------------- gather_evidence


async def test_evidence_logs_from_loki(loki: LokiStandIn, tmp_path: Path) -> None:
    started = T0 + timedelta(minutes=5)
    start_ns = NS0 + 300 * SEC
    job = {"cluster": "dev", "slurm_job_id": "418227"}
    loki.push({**job, "stream": "stdout"}, [(NS0, "attempt 0 output")])
    loki.push(
        {**job, "stream": "stdout"},
        [(start_ns + SEC, "0: checkpoint saved step=40"), (start_ns + 3 * SEC, "0: NCCL error")],
    )
    loki.push({**job, "stream": "stderr"}, [(start_ns + 2 * SEC, "1: Traceback (most recent)")])
    loki.push({"host": "n2", "unit": "kernel"}, [(NS0, "NVRM: Xid 48 (before the job)")])
    loki.push({"host": "n2", "unit": "kernel"}, [(start_ns + 2 * SEC, "NVRM: Xid 79, pid=1")])
    loki.push({"host": "n3", "unit": "kernel"}, [(start_ns, "not allocated")])
    s = settings("loki", loki.url)
    running = Job(job_id="418227", nodes=["n1", "n2"], start_time=started)
    async with LokiStore(s, environ={}) as store:
        job_log, node_logs = await fetch_evidence_logs(
            store, "dev", running, now=T0 + timedelta(minutes=10)
        )
    assert job_log == ("0: checkpoint saved step=40\n1: Traceback (most recent)\n0: NCCL error\n")
    assert node_logs == {"n2": "2026-03-01T12:05:02+00:00 NVRM: Xid 79, pid=1\n"}
    # into the bundle exactly as file-sourced logs go
    meta = BundleJob(cluster="dev", job_id="418227", state="FAILED", observed_at=T0)
    bundle = read_bundle(write_bundle(tmp_path / "incident", meta, job_log, node_logs))
    assert bundle.job_log == job_log and bundle.node_logs == node_logs
