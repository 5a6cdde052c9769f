"""The worker's and the watcher's own /metrics and /healthz (relaunch/workers/process_metrics.py),
the listen-address setting, `relaunch dev status`'s health probe, and the processes' log lines:
the parts that need no Slurm, Temporal or PostgreSQL. The real processes:
tests/integration/test_process_health.py."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
import threading
import time
import urllib.error
import urllib.request
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from starlette.testclient import TestClient
from temporalio import activity, workflow
from temporalio.exceptions import ActivityError, ApplicationError
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from relaunch.cli.logs import JsonFormatter, TextFormatter
from relaunch.console.app import create_app
from relaunch.console.auth import ConsoleRole, write_tokens
from relaunch.console.web import Services
from relaunch.devstack.services import temporal_binary
from relaunch.devstack.status import probe_health
from relaunch.models.config import ClusterConfig, ConsoleSettings, MetricsSettings, listen_address
from relaunch.models.config_check import ConfigError, read_config
from relaunch.models.errors import ControllerUnavailableError
from relaunch.models.scheduler import Job, JobState, Node, NodeState
from relaunch.workers.process_metrics import (
    Health,
    MetricsAddressError,
    MetricsServer,
    WatchMetrics,
    WorkerMetrics,
    heartbeat,
    poll_stale_s,
)
from relaunch.workers.watcher import WatchConfig, Watcher
from relaunch.workers.worker import worker_address

T0 = datetime(2026, 2, 20, 9, 0, 0, tzinfo=UTC)
XID_79 = "[155044.078590] NVRM: Xid (PCI:0000:06:00): 79, GPU has fallen off the bus.\n"


def get(url: str, timeout: float = 5.0) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def series(text: str) -> dict[str, float]:
    """``name{labels}`` -> value, from Prometheus text."""
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            out[key] = float(value)
    return out


# ---------------------------------------------------------------------- the setting


def test_listen_address_takes_host_port_or_off() -> None:
    assert listen_address("0.0.0.0:9410") == ("0.0.0.0", 9410)
    assert listen_address("[::1]:9411") == ("::1", 9411)
    assert listen_address("off") is None
    for bad in ("9410", "localhost", "host:0", "host:70000", "-x:1", "a b:1", ""):
        with pytest.raises(ValueError):
            listen_address(bad)


def test_config_check_names_a_bad_metrics_setting(tmp_path: Path) -> None:
    path = tmp_path / "cluster.json"
    base = {"name": "c", "database_url": "postgresql://x/y", "bundle_dir": "/tmp/b"}
    path.write_text(json.dumps({**base, "metrics": {"watch_adress": "0.0.0.0:9410"}}))
    with pytest.raises(ConfigError) as exc:
        read_config(path)
    assert any("metrics.watch_adress" in line for line in exc.value.problems)
    path.write_text(json.dumps({**base, "metrics": {"worker_address": "0.0.0.0:99999"}}))
    with pytest.raises(ConfigError) as exc:
        read_config(path)
    assert any("metrics.worker_address" in line and "99999" in line for line in exc.value.problems)
    assert ClusterConfig.model_validate(base).metrics == MetricsSettings()  # off, both


def test_each_worker_process_of_a_supervisor_gets_its_own_port() -> None:
    config = ClusterConfig(
        name="c",
        database_url="postgresql://x/y",
        bundle_dir="/tmp/b",
        metrics=MetricsSettings(worker_address="0.0.0.0:9411"),
    )
    assert worker_address(config, None) == ("0.0.0.0", 9411)
    assert worker_address(config, (1, 4)) == ("0.0.0.0", 9411)
    assert worker_address(config, (4, 4)) == ("0.0.0.0", 9414)
    off = config.model_copy(update={"metrics": MetricsSettings()})
    assert worker_address(off, (2, 4)) is None


# ---------------------------------------------------------------------- health


def test_health_is_red_when_the_loop_stops_beating_or_a_check_fails() -> None:
    health = Health(started=100.0, loop_stale_s=10.0)
    assert health.verdict(105.0) == (True, "ok")  # starting: counted from start
    health.beat(106.0)
    assert health.verdict(115.0) == (True, "ok")
    ok, why = health.verdict(117.0)
    assert not ok and "event loop stalled: no heartbeat for 11s" in why
    health.beat(117.0)
    health.checks.append(lambda now: "Temporal worker not polling: q" if now > 118 else None)
    assert health.verdict(118.0)[0]
    assert health.verdict(119.0) == (False, "Temporal worker not polling: q")


def test_watcher_health_is_red_once_its_last_good_poll_is_stale() -> None:
    metrics = WatchMetrics("c")
    metrics.poll_interval_s = 1.0
    assert poll_stale_s(1.0) == 20.0 and poll_stale_s(2.0) == 20.0
    assert poll_stale_s(1.0, reconcile_s=2.0) == 20.0  # the active jobs every 2 s
    assert poll_stale_s(1.0, reconcile_s=30.0) == 60.0  # full listings alone, 30 s apart
    check = metrics.check(started=time.monotonic())
    assert check(time.monotonic() + 5) is None
    assert check(time.monotonic() + 25) == "no good poll yet: 25s ago (limit 20s)"
    metrics.polled(0.1, jobs=3, nodes=2)
    assert check(time.monotonic() + 19) is None
    assert (check(time.monotonic() + 30) or "").startswith("last good poll: 30s ago")
    metrics.standby = True  # a standby watcher polls nothing and is fine
    assert check(time.monotonic() + 300) is None


# ---------------------------------------------------------------------- the watcher's series


class Scheduler:
    def __init__(self, log: Path) -> None:
        self.fail = False
        self.jobs = [
            Job(
                job_id="101",
                user_id=os.getuid(),
                group_id=os.getgid(),
                state=JobState.RUNNING,
                partition="debug",
                comment="relaunch=on",
                nodes=["n1", "n2"],
                num_tasks=2,
                stdout_path=str(log),
                stderr_path=str(log),
            )
        ]

    async def list_jobs(self) -> list[Job]:
        if self.fail:
            raise ControllerUnavailableError("slurmctld does not answer")
        return self.jobs

    async def list_nodes(self) -> list[Node]:
        return [Node(name=n, state=NodeState.ALLOCATED) for n in ("n1", "n2")]


async def ignore(_: object) -> None:
    return None


async def test_a_watcher_counts_polls_jobs_nodes_bytes_and_detections(tmp_path: Path) -> None:
    log = tmp_path / "job.out"
    log.write_text("step 1\n")
    kern = tmp_path / "nodes" / "{node}" / "kern.log"
    for node in ("n1", "n2"):
        Path(str(kern).replace("{node}", node)).parent.mkdir(parents=True)
        Path(str(kern).replace("{node}", node)).touch()
    sched = Scheduler(log)
    watcher = Watcher(
        WatchConfig(cluster="c1", node_log_pattern=str(kern)), sched, ignore, liveness=None
    )
    await watcher.poll_once(T0)
    Path(str(kern).replace("{node}", "n2")).write_text(XID_79)
    found = await watcher.poll_once(T0 + timedelta(seconds=1))
    assert [d.source.value for d in found] == ["node_log"]
    text = MetricsServer(("127.0.0.1", 0), watcher.metrics.registry, Health()).metrics_text()
    got = series(text.decode())
    assert got['relaunch_watch_polls_total{cluster="c1",result="ok"}'] == 2
    assert got['relaunch_watch_polls_total{cluster="c1",result="error"}'] == 0
    assert got['relaunch_watch_jobs_watched{cluster="c1"}'] == 1
    assert got['relaunch_watch_nodes_watched{cluster="c1"}'] == 2
    assert got['relaunch_watch_detections_total{cluster="c1",source="node_log"}'] == 1
    assert got['relaunch_watch_bytes_read_total{cluster="c1"}'] == len("step 1\n") + len(XID_79)
    assert got['relaunch_watch_poll_duration_seconds_count{cluster="c1"}'] == 2
    assert got['relaunch_watch_last_good_poll_timestamp_seconds{cluster="c1"}'] > time.time() - 60
    assert got['relaunch_watch_probe_results_total{cluster="c1",result="failed"}'] == 0


async def test_a_failing_poll_counts_as_error_and_leaves_the_last_good_poll(
    tmp_path: Path,
) -> None:
    sched = Scheduler(tmp_path / "job.out")
    watcher = Watcher(
        WatchConfig(cluster="c1", poll_interval_s=0.05, log_interval_s=0.05), sched, ignore
    )
    stop = asyncio.Event()
    running = asyncio.create_task(watcher.run(stop))
    for _ in range(100):
        if watcher.metrics.last_good_poll is not None:
            break
        await asyncio.sleep(0.02)
    sched.fail = True
    good = watcher.metrics.last_good_poll
    await asyncio.sleep(0.5)
    stop.set()
    await running
    got = series(MetricsServer(("127.0.0.1", 0), watcher.metrics.registry, Health())
                 .metrics_text().decode())  # fmt: skip
    assert got['relaunch_watch_polls_total{cluster="c1",result="error"}'] >= 3
    assert watcher.metrics.last_good_poll == good


# ---------------------------------------------------------------------- the server


def test_the_server_answers_metrics_and_health_and_says_why_red() -> None:
    metrics = WatchMetrics("c1")
    health = Health(loop_stale_s=1000)
    reasons: list[str] = []
    health.checks.append(lambda now: reasons[0] if reasons else None)
    server = MetricsServer(
        ("127.0.0.1", 0), metrics.registry, health, extra=lambda: b"temporal_x_total 1\n"
    ).start()
    try:
        base = f"http://127.0.0.1:{server.port}"
        status, text = get(f"{base}/metrics")
        assert status == 200
        assert 'relaunch_watch_polls_total{cluster="c1",result="ok"} 0.0' in text
        assert text.endswith("temporal_x_total 1\n")
        assert get(f"{base}/healthz") == (200, "ok\n")
        reasons.append("last good poll: 31s ago (limit 20s)")
        assert get(f"{base}/healthz") == (503, "last good poll: 31s ago (limit 20s)\n")
        assert get(f"{base}/nothing")[0] == 404
        with pytest.raises(
            MetricsAddressError, match=f"cannot serve metrics on 127.0.0.1:{server.port}"
        ):
            MetricsServer(("127.0.0.1", server.port), metrics.registry, health)
    finally:
        server.close()


def test_a_wedged_event_loop_is_answered_red() -> None:
    """The server runs beside the loop: while the loop is blocked (a synchronous call that
    hangs), /healthz still answers, and says the loop stalled."""
    health = Health(loop_stale_s=0.5)
    server = MetricsServer(("127.0.0.1", 0), WatchMetrics("c").registry, health).start()
    url = f"http://127.0.0.1:{server.port}/healthz"
    seen: list[tuple[int, str]] = []

    async def main() -> None:
        beating = asyncio.create_task(heartbeat(health, interval_s=0.1))
        await asyncio.sleep(0.3)
        seen.append(await asyncio.to_thread(get, url))
        time.sleep(1.5)  # noqa: ASYNC251 - the point: the loop wedged, nothing else runs
        beating.cancel()

    def probe_while_wedged() -> None:
        time.sleep(1.3)
        seen.append(get(url))

    prober = threading.Thread(target=probe_while_wedged)
    try:
        prober.start()
        asyncio.run(main())
        prober.join()
    finally:
        server.close()
    assert seen[0] == (200, "ok\n")
    assert seen[1][0] == 503 and seen[1][1].startswith("event loop stalled: no heartbeat for")


def test_dev_status_probe_is_red_when_health_is_red_or_does_not_answer() -> None:
    health = Health(loop_stale_s=1000, checks=[lambda now: "no good poll yet: 40s ago"])
    server = MetricsServer(("127.0.0.1", 0), WatchMetrics("c").registry, health).start()
    try:
        assert probe_health(f"http://127.0.0.1:{server.port}/healthz") == (
            False,
            "/healthz 503: no good poll yet: 40s ago",
        )
        health.checks.clear()
        assert probe_health(f"http://127.0.0.1:{server.port}/healthz") == (True, "")
    finally:
        server.close()
    # A stopped process: its socket accepts (the kernel does) but nothing ever answers.
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        began = time.monotonic()
        ok, why = probe_health(f"http://127.0.0.1:{silent.getsockname()[1]}/healthz", 1.0)
        assert not ok and "did not answer" in why
        assert time.monotonic() - began < 3


# ---------------------------------------------------------------------- the console


def test_console_health_names_the_connection_that_is_down(tmp_path: Path) -> None:
    """The console's /healthz: 503 naming the database and Temporal when neither answers
    (a closed port, a health check that fails), /livez still ok; 200 once both answer."""
    write_tokens(tmp_path / "tokens.json", [("vera", ConsoleRole.VIEWER)])
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    config = ClusterConfig(
        name="c",
        database_url=f"postgresql://relaunch@127.0.0.1:{port}/relaunch?connect_timeout=1",
        bundle_dir=str(tmp_path / "bundles"),
        console=ConsoleSettings(tokens_file=str(tmp_path / "tokens.json")),
    )
    temporal_up = False

    async def temporal_health() -> None:
        if not temporal_up:
            raise RuntimeError("Failed client connect: connection refused")

    app = create_app(
        config, Services(temporal_health=temporal_health), secret="health-test-secret-0123456789"
    )
    with TestClient(app) as client:
        r = client.get("/healthz")
        assert r.status_code == 503
        lines = r.text.splitlines()
        assert lines[0] == "database: no answer within 3 s", lines
        assert lines[1] == "temporal: Failed client connect: connection refused"
        assert client.get("/livez").text == "ok"
        temporal_up = True
        assert client.get("/healthz").text.splitlines()[0].startswith("database: ")
        assert len(client.get("/healthz").text.splitlines()) == 1


# ---------------------------------------------------------------------- log lines


def record(msg: str, **extra: object) -> logging.LogRecord:
    rec = logging.LogRecord("relaunch.workers.watcher", logging.WARNING, "f", 1, msg, None, None)
    rec.__dict__.update(extra)
    return rec


def test_json_log_lines_keep_the_structured_fields() -> None:
    line = json.loads(
        JsonFormatter("worker[1/2]").format(
            record("poll failed", error="slurmctld does not answer", retryable=True)
        )
    )
    assert line["message"] == "poll failed"
    assert line["level"] == "WARNING"
    assert line["logger"] == "relaunch.workers.watcher"
    assert line["process"] == "worker[1/2]"
    assert line["error"] == "slurmctld does not answer"
    assert line["retryable"] is True
    assert line["time"].endswith("+00:00")


def test_text_log_lines_keep_the_structured_fields() -> None:
    text = TextFormatter().format(record("poll failed", error="no answer", nodes=["n1"]))
    assert text.endswith('poll failed error="no answer" nodes=["n1"]')


def test_a_supervisor_passes_the_log_settings_to_its_workers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from click.testing import CliRunner

    from relaunch.cli import incidents
    from relaunch.cli.main import cli
    from relaunch.workers import supervisor

    made: list[list[str]] = []

    class Supervisor:
        def __init__(self, argv: list[str], count: int, **_: object) -> None:
            made.append(argv)

        def run(self) -> int:
            return 0

    monkeypatch.setattr(supervisor, "Supervisor", Supervisor)
    monkeypatch.setattr(incidents, "_logging", lambda *args: None)
    config = tmp_path / "c.json"
    config.write_text(
        json.dumps({"name": "c", "database_url": "postgresql://x/y", "bundle_dir": "/b"})
    )
    result = CliRunner().invoke(
        cli,
        ["worker", "--config", str(config), "--processes", "2", "--log-level", "debug"],
        env={"RELAUNCH_LOG_FORMAT": "json"},
    )
    assert result.exit_code == 0, result.output
    (argv,) = made
    assert argv[argv.index("--log-format") + 1] == "json"
    assert argv[argv.index("--log-level") + 1] == "debug"
    bad = CliRunner().invoke(cli, ["watch", "--config", str(config), "--log-format", "xml"])
    assert bad.exit_code == 2 and "'xml' is not one of 'text', 'json'" in bad.output


# ---------------------------------------------------------------------- the worker's activities


@activity.defn
async def works(value: int) -> int:
    return value + 1


@activity.defn
async def breaks(value: int) -> int:
    raise ApplicationError("the scheduler refused", non_retryable=True)


@workflow.defn(sandboxed=False)
class TwoSteps:
    @workflow.run
    async def run(self, value: int) -> str:
        await workflow.execute_activity(works, value, start_to_close_timeout=timedelta(seconds=10))
        try:
            await workflow.execute_activity(
                breaks, value, start_to_close_timeout=timedelta(seconds=10)
            )
        except ActivityError:
            return "broke"
        return "did not break"


async def test_a_worker_counts_each_activity_by_result() -> None:
    """relaunch_worker_activities_total from a real worker on a Temporal dev server."""
    metrics = WorkerMetrics("c1", lambda: 3)
    async with (
        await WorkflowEnvironment.start_local(
            dev_server_existing_path=str(temporal_binary())
        ) as env,
        Worker(
            env.client,
            task_queue="metrics-test",
            workflows=[TwoSteps],
            activities=[works, breaks],
            interceptors=[metrics.interceptor()],
        ),
    ):
        result = await env.client.execute_workflow(
            TwoSteps.run, 1, id="metrics-test", task_queue="metrics-test"
        )
    assert result == "broke"
    got = series(
        MetricsServer(("127.0.0.1", 0), metrics.registry, Health()).metrics_text().decode()
    )
    assert got['relaunch_worker_activities_total{activity="works",cluster="c1",result="ok"}'] == 1
    assert (
        got['relaunch_worker_activities_total{activity="breaks",cluster="c1",result="error"}'] == 1
    )
    assert got["relaunch_worker_audit_write_failures_total"] == 3
