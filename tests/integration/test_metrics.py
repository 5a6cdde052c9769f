"""``GET /metrics`` on the console: every series, computed from the audit trail, in the text
format Prometheus parses (read back with prometheus_client's own parser)."""

from __future__ import annotations

import asyncio
import os
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families
from starlette.testclient import TestClient

from relaunch.connectors.audit import AuditStore
from relaunch.console.app import create_app
from relaunch.console.auth import ConsoleRole, write_tokens
from relaunch.devstack.stack import Stack
from relaunch.models.config import ClusterConfig, ConsoleSettings
from relaunch.models.recovery import AuditRecord


async def _seed(url: str, cluster: str) -> tuple[str, str]:
    store = await AuditStore.open(url)
    t = datetime.now(UTC)
    done, waiting = f"relaunch-{cluster}-1-0", f"relaunch-{cluster}-2-0"

    async def row(incident: str, kind: str, dt: float, **kw: Any) -> None:
        await store.record(
            AuditRecord(incident_id=incident, kind=kind, at=t + timedelta(seconds=dt), **kw)
        )

    try:
        for i, incident in enumerate((done, waiting)):
            await store.ensure_incident(incident, cluster, str(i + 1), 0)
            await row(
                incident, "detection", 0, data={"source": "job_log", "detection_latency_s": 0.4}
            )
            await row(incident, "verdict", 1, data={"category": "gpu_hardware"})
            await row(incident, "stage", 2, stage="awaiting_approval")
        await row(done, "detection", 0.5, data={"source": "telemetry", "detection_latency_s": 7.0})
        await row(done, "guard", 1.5, data={"guard": "blast_radius", "allowed": False})
        await row(done, "stage", 30, stage="isolating")
        await row(done, "action", 42, data={"step": "drain", "changed": True})
        await row(done, "action", 43, data={"step": "restart", "changed": False})
        await row(done, "stage", 60, stage="done")
    finally:
        await store.close()
    return done, waiting


def _scrape(client: TestClient, token: str) -> dict[str, Any]:
    r = client.get("/metrics", headers={"authorization": f"Bearer {token}"})
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/plain")
    return {f.name: f for f in text_string_to_metric_families(r.text)}


def _value(families: dict[str, Any], sample: str, **labels: str) -> float:
    for family in families.values():
        for s in family.samples:
            if s.name == sample and all(s.labels.get(k) == v for k, v in labels.items()):
                return float(s.value)
    raise AssertionError(f"no sample {sample} {labels}")


def test_metrics_expose_every_series_from_the_audit_trail(stack: Stack, tmp_path: Path) -> None:
    cluster = f"met{os.getpid() % 10000}"
    tokens = write_tokens(
        tmp_path / "tokens.json", [("vera", ConsoleRole.VIEWER), ("am", ConsoleRole.INTAKE)]
    )
    config = ClusterConfig(
        name=cluster,
        database_url=stack.database_url,
        bundle_dir=str(tmp_path / "bundles"),
        console=ConsoleSettings(tokens_file=str(tmp_path / "tokens.json")),
    )
    with TestClient(create_app(config, secret="metrics-test-secret-0123456789")) as client:
        assert client.get("/metrics").status_code == 401
        r = client.get("/metrics", headers={"authorization": f"Bearer {tokens['am']}"})
        assert r.status_code == 403
        before = _scrape(client, tokens["vera"])
    asyncio.run(_seed(stack.database_url, cluster))
    # A fresh console: a scrape within SNAPSHOT_TTL_S of the last one is answered from it.
    with TestClient(create_app(config, secret="metrics-test-secret-0123456789")) as client:
        after = _scrape(client, tokens["vera"])

    for name in (
        "relaunch_detections",
        "relaunch_detection_latency_seconds",
        "relaunch_detection_to_action_seconds",
        "relaunch_actions",
        "relaunch_approvals_pending",
        "relaunch_guard_refusals",
        "process_cpu_seconds",
    ):
        assert name in after, sorted(after)
    assert after["relaunch_detections"].type == "counter"
    assert after["relaunch_detection_latency_seconds"].type == "histogram"

    def grew(sample: str, **labels: str) -> float:
        try:
            old = _value(before, sample, **labels)
        except AssertionError:
            old = 0.0
        return _value(after, sample, **labels) - old

    # Every series carries the cluster; the database is the session's, so compare with before.
    assert (
        grew(
            "relaunch_detections_total", cluster=cluster, source="job_log", category="gpu_hardware"
        )
        == 2
    )
    assert (
        grew(
            "relaunch_detections_total",
            cluster=cluster,
            source="telemetry",
            category="gpu_hardware",
        )
        == 1
    )
    assert grew("relaunch_detection_latency_seconds_count", cluster=cluster) == 3
    assert grew("relaunch_detection_latency_seconds_bucket", cluster=cluster, le="0.5") == 2
    assert grew("relaunch_detection_latency_seconds_bucket", cluster=cluster, le="10.0") == 3
    assert abs(grew("relaunch_detection_latency_seconds_sum", cluster=cluster) - 7.8) < 1e-6
    assert grew("relaunch_detection_to_action_seconds_count", cluster=cluster) == 1
    assert grew("relaunch_detection_to_action_seconds_bucket", cluster=cluster, le="30.0") == 0
    assert grew("relaunch_detection_to_action_seconds_bucket", cluster=cluster, le="60.0") == 1
    assert grew("relaunch_actions_total", cluster=cluster, step="drain", result="done") == 1
    assert grew("relaunch_actions_total", cluster=cluster, step="restart", result="unchanged") == 1
    assert grew("relaunch_guard_refusals_total", cluster=cluster, guard="blast_radius") == 1
    assert grew("relaunch_approvals_pending", cluster=cluster) == 1  # the done one no longer waits
