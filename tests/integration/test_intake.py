"""Signals pushed in: a real Prometheus Alertmanager posts to the console's intake, which starts
the recovery of the real job running on the alert's node; bad or unauthenticated requests are
refused with a clear message and change nothing; the Slurm hook script posts with curl."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from starlette.testclient import TestClient

from relaunch.cli.console import TemporalDecider
from relaunch.console.app import create_app
from relaunch.console.auth import ConsoleRole, write_tokens
from relaunch.console.intake import intake_incident
from relaunch.console.web import Services
from relaunch.devstack import procs
from relaunch.devstack.stack import Stack
from relaunch.models.config import ClusterConfig, ConsoleSettings
from relaunch.models.recovery import Detection, Mode, Policy
from tests.integration.serve import serve
from tests.integration.test_recovery import start_training

REPO = Path(__file__).resolve().parents[2]
HOOK = REPO / "deploy" / "hooks" / "relaunch-notify-slurm.sh"
ALERTMANAGER = shutil.which("prometheus-alertmanager") or shutil.which("alertmanager")
USERS = [("am", ConsoleRole.INTAKE), ("vera", ConsoleRole.VIEWER), ("adam", ConsoleRole.ADMIN)]


def _rows(database_url: str, incident: str, kind: str | None = None) -> list[dict[str, Any]]:
    with psycopg.connect(database_url) as conn:
        cur = conn.execute(
            "select kind, summary, data, dedupe_key from audit_events where incident_id = %s"
            " and (%s::text is null or kind = %s) order by id",
            (incident, kind, kind),
        )
        return [dict(zip(["kind", "summary", "data", "key"], r, strict=True)) for r in cur]


@pytest.fixture
def alertmanager(tmp_path: Path) -> Iterator[Any]:
    """Start a real Alertmanager whose webhook receiver posts to ``url`` with ``token``."""
    if ALERTMANAGER is None:
        pytest.skip("prometheus-alertmanager is not installed (scripts/install-deps.sh)")
    procs_: list[subprocess.Popen[bytes]] = []

    def start(url: str, token: str) -> str:
        (tmp_path / "am.token").write_text(token)
        (tmp_path / "am.token").chmod(0o600)
        config = {
            "route": {
                "receiver": "relaunch",
                "group_by": ["alertname", "Hostname"],
                "group_wait": "0s",
                "group_interval": "1s",
                "repeat_interval": "1h",
            },
            "receivers": [
                {
                    "name": "relaunch",
                    "webhook_configs": [
                        {
                            "url": url,
                            "send_resolved": True,
                            "http_config": {
                                "authorization": {"credentials_file": str(tmp_path / "am.token")}
                            },
                        }
                    ],
                }
            ],
        }
        cfg = tmp_path / "alertmanager.yml"
        cfg.write_text(json.dumps(config))  # YAML is a superset of JSON
        port = procs.free_port()
        log = open(tmp_path / "alertmanager.log", "ab")  # noqa: SIM115 - owned by the process
        procs_.append(
            subprocess.Popen(
                [
                    ALERTMANAGER,
                    f"--config.file={cfg}",
                    f"--storage.path={tmp_path / 'am-data'}",
                    f"--web.listen-address=127.0.0.1:{port}",
                    "--cluster.listen-address=",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        )
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(f"{base}/-/ready", timeout=2).status_code == 200:
                    return base
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise AssertionError((tmp_path / "alertmanager.log").read_text()[-2000:])
            time.sleep(0.2)

    yield start
    for p in procs_:
        p.terminate()
        p.wait(timeout=10)


async def test_alertmanager_alert_on_a_running_job_s_node_is_recorded_and_restarts_nothing(
    make_harness: Any, alertmanager: Any, tmp_path: Path
) -> None:
    """A real Alertmanager posts a DCGM Xid alert naming the node of a running job: the alert
    is recorded as an untrusted pointer (docs/trust.md), and by itself starts no recovery of
    the running job; Alertmanager's retry of it is recorded once."""
    h = make_harness(Policy(mode=Mode.MONITOR))
    h.start("worker")  # no watcher: the alert is the only way a recovery could start
    tokens = write_tokens(tmp_path / "tokens.json", USERS)
    config = h.config.model_copy(
        update={"console": ConsoleSettings(tokens_file=str(tmp_path / "tokens.json"))}
    )
    app = create_app(
        config,
        Services(scheduler=h.sched, deliver=TemporalDecider(config).deliver),
        secret="intake-test-session-secret-0123456789",
    )
    job_id, nodes, _ = await start_training(h)
    culprit = nodes[0]
    with serve(app) as console_url:
        am = alertmanager(f"{console_url}/intake/alertmanager", tokens["am"])
        alert = {
            "labels": {
                "alertname": "DCGMXidError",
                "Hostname": culprit,
                "gpu": "0",
                "xid": "79",
                "severity": "critical",
            },
            "annotations": {"summary": f"GPU 0 on {culprit}: Xid 79, fallen off the bus"},
            "startsAt": datetime.now(UTC).isoformat(),
        }
        posted = await asyncio.to_thread(
            httpx.post, f"{am}/api/v2/alerts", json=[alert], timeout=10
        )
        assert posted.status_code == 200, posted.text

        def alert_rows() -> list[dict[str, Any]]:
            rows = _rows(h.stack.database_url, intake_incident(config.name), "intake")
            return [r for r in rows if r["data"].get("source") == "alertmanager"]

        async def recorded_once() -> bool:  # the alert's row, then its (empty) delivery's
            rows = _rows(h.stack.database_url, intake_incident(config.name), "intake")
            return bool(alert_rows()) and any("delivered" in r["data"] for r in rows)

        await h.until(recorded_once, "the alert was never recorded", timeout=60)
        recorded = alert_rows()
        assert recorded[0]["data"]["labels"]["Hostname"] == culprit
        assert recorded[0]["data"]["trusted"] is False
        intake_rows = _rows(h.stack.database_url, intake_incident(config.name), "intake")

        # Alertmanager's retry of the same notification: recorded once.
        body = {
            "version": "4",
            "receiver": "relaunch",
            "status": "firing",
            "alerts": [
                {
                    "status": "firing",
                    "labels": alert["labels"],
                    "annotations": alert["annotations"],
                    "startsAt": recorded[0]["data"]["starts_at"],
                    "endsAt": "0001-01-01T00:00:00Z",
                    "fingerprint": recorded[0]["data"]["fingerprint"],
                }
            ],
        }
        again = await asyncio.to_thread(
            httpx.post,
            f"{console_url}/intake/alertmanager",
            json=body,
            headers={"authorization": f"Bearer {tokens['am']}"},
            timeout=10,
        )
        assert again.status_code == 200, again.text
        assert not again.json()["alerts"][0]["recorded"]
        assert len(_rows(h.stack.database_url, intake_incident(config.name), "intake")) == len(
            intake_rows
        )
        # No recovery: the running job is left alone (and the intake's own records are no
        # incident either).
        await asyncio.sleep(5)
        started = await h.audit.incidents(cluster=config.name)
        detections = [
            (i.id, e.actor, e.summary, e.data.get("source"))
            for i in started
            for e in await h.events(i.id, "detection")
        ]
        assert started == [], f"job {job_id}'s alert started recoveries: {detections}"


# ------------------------------------------------------------------ refusals, no stack job


class Recorder:
    def __init__(self) -> None:
        self.calls: list[Detection] = []

    async def __call__(self, det: Detection) -> bool:
        self.calls.append(det)
        return True


@pytest.fixture
def intake_env(stack: Stack, tmp_path: Path) -> Iterator[tuple[TestClient, dict[str, str], str]]:
    name = f"intake{os.getpid() % 10000}x{time.monotonic_ns() % 1000}"
    tokens = write_tokens(tmp_path / "tokens.json", USERS)
    config = ClusterConfig(
        name=name,
        **stack.slurm.config_fields,
        temporal_address=stack.temporal_address,
        database_url=stack.database_url,
        bundle_dir=str(tmp_path / "bundles"),
        console=ConsoleSettings(tokens_file=str(tmp_path / "tokens.json")),
    )
    recorder = Recorder()
    app = create_app(config, Services(scheduler=stack.scheduler(), deliver=recorder))
    app.state.recorder = recorder
    with TestClient(app) as client:
        yield client, tokens, name


def test_malformed_and_unauthenticated_intake_is_refused_and_changes_nothing(
    intake_env: tuple[TestClient, dict[str, str], str], stack: Stack
) -> None:
    client, tokens, name = intake_env
    good = {
        "version": "4",
        "status": "firing",
        "receiver": "r",
        "alerts": [
            {
                "status": "firing",
                "labels": {"alertname": "NodeDown", "instance": "n1:9100"},
                "startsAt": "2026-01-01T00:00:00Z",
                "fingerprint": "abc",
            }
        ],
    }
    am, sl = "/intake/alertmanager", "/intake/slurm"
    bearer = {"authorization": f"Bearer {tokens['am']}"}

    r = client.post(am, json=good)
    assert r.status_code == 401 and r.json()["field"] == "authorization"
    assert client.post(sl, json={"event": "node_down", "node": "n1"}).status_code == 401
    r = client.post(am, json=good, headers={"authorization": "Bearer rl_wrong"})
    assert r.status_code == 401 and "unknown" in r.json()["error"]
    for person in ("vera", "adam"):  # people's tokens, even an admin's, are not intake tokens
        r = client.post(am, json=good, headers={"authorization": f"Bearer {tokens[person]}"})
        assert r.status_code == 403, r.text
    # ... and an intake token opens no page.
    assert client.get("/audit.json", headers=bearer).status_code == 403

    def refused(path: str, body: Any, status: int, field: str, words: str) -> None:
        raw = body if isinstance(body, bytes) else json.dumps(body).encode()
        r = client.post(path, content=raw, headers={**bearer, "content-type": "application/json"})
        assert r.status_code == status, r.text
        assert r.json()["field"] == field and words in r.json()["error"], r.json()

    refused(am, b"{not json", 400, "body", "not valid JSON")
    refused(am, [1, 2], 422, "body", "JSON object")
    refused(am, {**good, "version": "3"}, 422, "version", "not supported")
    refused(am, {k: v for k, v in good.items() if k != "alerts"}, 422, "alerts", "required")
    bad_status = {**good, "alerts": [{**good["alerts"][0], "status": "burning"}]}  # type: ignore[dict-item]
    refused(am, bad_status, 422, "alerts.0.status", "firing")
    hostile = {
        **good,
        "alerts": [
            {**good["alerts"][0], "labels": {"alertname": "X", "Hostname": "n1;reboot"}}  # type: ignore[dict-item]
        ],
    }
    refused(am, hostile, 422, "alerts.0.labels.Hostname", "invalid node name")
    bad_job = {
        **good,
        "alerts": [
            {**good["alerts"][0], "labels": {"alertname": "X", "slurm_job_id": "12$(id)"}}  # type: ignore[dict-item]
        ],
    }
    refused(am, bad_job, 422, "alerts.0.labels.slurm_job_id", "invalid job id")
    refused(sl, {"event": "node_exploded", "node": "n1"}, 422, "event", "node_down")
    refused(sl, {"event": "node_down", "node": "-rf"}, 422, "node", "invalid node name")
    refused(sl, {"event": "job_end", "job_id": "1;2"}, 422, "job_id", "invalid job id")
    refused(sl, {"event": "job_end"}, 422, "job_id", "needs job_id")
    refused(sl, {"event": "node_down"}, 422, "node", "needs node")
    refused(sl, {"event": "node_down", "node": "n1", "extra": 1}, 422, "extra", "")

    assert _rows(stack.database_url, intake_incident(name)) == []
    assert client.app.state.recorder.calls == []  # type: ignore[attr-defined]

    # A resolved alert and a normal job end: recorded, nothing delivered.
    resolved = {
        **good,
        "status": "resolved",
        "alerts": [{**good["alerts"][0], "status": "resolved"}],
    }  # type: ignore[dict-item]
    assert client.post(am, json=resolved, headers=bearer).status_code == 200
    r = client.post(
        sl, json={"event": "job_end", "job_id": "42", "state": "COMPLETED"}, headers=bearer
    )
    assert r.status_code == 200 and "no action" in r.json()["note"]
    assert len(_rows(stack.database_url, intake_incident(name))) == 2
    assert client.app.state.recorder.calls == []  # type: ignore[attr-defined]


def test_slurm_hook_script_posts_with_curl_and_a_root_only_token(
    stack: Stack, tmp_path: Path
) -> None:
    name = f"hook{os.getpid() % 10000}"
    tokens = write_tokens(tmp_path / "tokens.json", USERS)
    config = ClusterConfig(
        name=name,
        **stack.slurm.config_fields,
        database_url=stack.database_url,
        bundle_dir=str(tmp_path / "bundles"),
        console=ConsoleSettings(tokens_file=str(tmp_path / "tokens.json")),
    )
    recorder = Recorder()
    app = create_app(config, Services(scheduler=stack.scheduler(), deliver=recorder))
    token_file = tmp_path / "intake.token"
    token_file.write_text(tokens["am"] + "\n")
    with serve(app) as url:
        env = {
            "PATH": os.environ["PATH"],
            "RELAUNCH_INTAKE_URL": url,
            "RELAUNCH_INTAKE_TOKEN_FILE": str(token_file),
            "RELAUNCH_NOTIFY_CONF": "/nonexistent",
            **stack.slurm_env,
        }
        token_file.chmod(0o644)  # readable by others: refused, nothing sent, exit 0 anyway
        r = subprocess.run(
            ["sh", str(HOOK), "node_down", "n1"], env=env, capture_output=True, text=True
        )
        assert r.returncode == 0 and "chmod 600" in r.stderr
        assert _rows(stack.database_url, intake_incident(name)) == []

        token_file.chmod(0o600)
        node = stack.slurm.nodes[-1]  # no watched job runs there: recorded, nothing delivered
        r = subprocess.run(
            ["sh", str(HOOK), "node_down", node], env=env, capture_output=True, text=True
        )
        assert r.returncode == 0 and r.stderr == "", r.stderr
        epilog = {**env, "SLURM_JOB_ID": "77", "SLURMD_NODENAME": node, "SLURM_JOB_EXIT_CODE": "0"}
        r = subprocess.run(["sh", str(HOOK)], env=epilog, capture_output=True, text=True)
        assert r.returncode == 0 and r.stderr == "", r.stderr
    rows = _rows(stack.database_url, intake_incident(name), "intake")
    events = [
        (r["data"]["event"], r["data"]["node"], r["data"]["job_id"], r["data"]["state"])
        for r in rows
        if "event" in r["data"]
    ]
    assert ("node_down", node, None, None) in events
    assert ("job_end", node, "77", "COMPLETED") in events
    assert recorder.calls == []
