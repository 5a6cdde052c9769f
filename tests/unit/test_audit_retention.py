"""Retention without a database: what `relaunch audit purge` accepts as its date and name, which
bundle directories it may remove, the retention setting's bounds, and the console's incremental
counters folding rows in (a later verdict moves an incident's detections, an approval ends a
wait, detection-to-action is taken back and observed again)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from pydantic import ValidationError

from relaunch.cli.main import cli
from relaunch.connectors.retention import (
    RetentionError,
    bundle_path,
    check_by,
    month_end,
    parse_before,
    remove_bundles,
    retention_before,
)
from relaunch.console.metrics import AuditCounters, _Histogram
from relaunch.models.config import AuditSettings, ClusterConfig

NOW = datetime(2026, 12, 5, 12, 0, tzinfo=UTC)


def test_before_is_a_date_or_a_zoned_time_at_least_30_days_ago() -> None:
    assert parse_before("2026-01-31", now=NOW) == datetime(2026, 1, 31, tzinfo=UTC)
    assert parse_before("2026-02-01T06:00:00+02:00", now=NOW) == datetime(2026, 2, 1, 4, tzinfo=UTC)
    for bad, says in (
        ("2026-11-20", "less than 30 days ago"),  # a mistyped date cannot erase last month
        ("2062-01-01", "less than 30 days ago"),
        ("2026-02-01T06:00:00", "time zone"),
        ("last tuesday", "not a date"),
        ("2026-13-01", "not a date"),
    ):
        with pytest.raises(RetentionError, match=says):
            parse_before(bad, now=NOW)


def test_a_scheduled_purge_uses_the_retention_setting() -> None:
    assert retention_before(90, now=NOW) == NOW - timedelta(days=90)
    with pytest.raises(RetentionError, match="audit.retention_days"):
        retention_before(None, now=NOW)
    assert AuditSettings(retention_days=30).retention_days == 30
    for bad in ({"retention_days": 29}, {"retention_days": 40_000}, {"partitions_ahead": 0}):
        with pytest.raises(ValidationError):
            AuditSettings.model_validate(bad)
    with pytest.raises(ValidationError, match="retention_dayz"):
        ClusterConfig.model_validate(
            {"name": "c", "database_url": "x", "bundle_dir": "/b", "audit": {"retention_dayz": 9}}
        )


def test_who_purges_is_named() -> None:
    assert check_by("  ana ") == "ana"
    for bad in ("", "   ", "a\x1b[2J", "x" * 201):
        with pytest.raises(RetentionError, match="who purges"):
            check_by(bad)


def test_month_partition_names_give_their_end() -> None:
    assert month_end("audit_events_p202612") == datetime(2027, 1, 1, tzinfo=UTC)
    assert month_end("audit_events_p202601") == datetime(2026, 2, 1, tzinfo=UTC)
    assert month_end("audit_events_default") is None


def test_only_bundles_inside_bundle_dir_are_removed(tmp_path: Path) -> None:
    bundles = tmp_path / "bundles"
    for name in ("relaunch-prod-1-0", "relaunch-prod-2-0"):
        (bundles / name / "logs").mkdir(parents=True)
    outside = tmp_path / "precious"
    outside.mkdir()
    (bundles / "link").symlink_to(outside)
    for bad in ("..", ".", "a/../../precious", "", "x\0y"):
        assert bundle_path(bundles, bad) is None
    removed = remove_bundles(bundles, ["relaunch-prod-1-0", "..", "link", "missing"])
    assert removed == 1
    assert not (bundles / "relaunch-prod-1-0").exists()
    assert (bundles / "relaunch-prod-2-0").is_dir() and outside.is_dir()


def test_purge_refuses_without_a_date_or_a_retention(tmp_path: Path) -> None:
    config = tmp_path / "c.json"
    config.write_text('{"name": "c", "database_url": "postgresql://x@/x", "bundle_dir": "/b"}')
    result = CliRunner().invoke(cli, ["audit", "purge", "--config", str(config), "--by", "ana"])
    assert result.exit_code == 1
    assert "no --before and no audit.retention_days" in result.output
    assert "Traceback" not in result.output
    help_text = CliRunner().invoke(cli, ["audit", "purge", "--help"]).output
    assert "wholly older than DATE" in help_text and "--dry-run" in help_text


def test_histogram_takes_an_observation_back() -> None:
    h = _Histogram((1.0, 10.0))
    h.add(5.0)
    h.add(0.5)
    h.add(5.0, -1)
    assert h.row() == [1, 0.5, 1, 1]


def _row(n: int, incident: str, kind: str, at: datetime, **kw: Any) -> dict[str, Any]:
    base = {
        "id": n,
        "incident_id": incident,
        "cluster": "prod",
        "kind": kind,
        "at": at,
        "stage": None,
        "source": "job_log",
        "latency": None,
        "category": "unknown",
        "step": "unknown",
        "changed": False,
        "guard": "unknown",
        "allowed": True,
    }
    return {**base, **kw}


def test_counters_fold_rows_in_as_a_recount_would() -> None:
    counters = AuditCounters(db=None)  # type: ignore[arg-type]  # no database: rows fed in
    t = NOW
    rows = [
        _row(1, "a", "detection", t, latency=0.4),
        _row(2, "a", "verdict", t, category="gpu_hardware"),
        _row(3, "a", "detection", t + timedelta(seconds=2), source="telemetry"),
        _row(4, "a", "stage", t, stage="awaiting_approval"),
        _row(5, "a", "verdict", t, category="network"),  # the latest verdict decides
        _row(6, "a", "action", t + timedelta(seconds=50), step="drain", changed=True),
        _row(7, "a", "approval", t),
        _row(8, "b", "stage", t, stage="awaiting_approval"),
        _row(9, "b", "guard", t, guard="blast_radius", allowed=False),
        _row(10, "a", "detection", t - timedelta(seconds=20)),  # an earlier first detection
        _row(11, "b", "stage", t, stage="failed"),
        _row(12, "b", "stage", t, stage="failed"),  # one failed recovery, not two
    ]
    for row in rows:
        counters._count(row)
    cl = counters._clusters["prod"]
    assert dict(cl.detections) == {("job_log", "network"): 2, ("telemetry", "network"): 1}
    assert cl.latency.row() == [1, 0.4, 0, 0, *[1] * 9]
    assert cl.to_action.count == 1 and cl.to_action.total == 70.0  # taken back, observed again
    assert dict(cl.actions) == {("drain", "done"): 1}
    assert dict(cl.refusals) == {"blast_radius": 1}
    assert cl.failed == 1
    assert [i for i, s in counters._incidents.items() if s.waiting_since] == []
