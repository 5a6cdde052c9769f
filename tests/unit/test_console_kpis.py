"""KPI arithmetic of the console's overview."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from relaunch.console.kpis import (
    BadWindowError,
    IncidentTimes,
    compute,
    human_duration,
    parse_window,
    percentile,
    time_lost,
)

T0 = datetime(2026, 5, 1, 12, 0, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def test_percentile_interpolates_between_ranks() -> None:
    assert percentile([], 50) is None
    assert percentile([4.0], 95) == 4.0
    assert percentile([1, 2, 3, 4], 50) == 2.5
    assert percentile(list(range(1, 101)), 95) == pytest.approx(95.05)
    assert percentile([10, 1, 5], 100) == 10


def test_windows() -> None:
    assert parse_window(None) == ("24h", timedelta(hours=24))
    assert parse_window("30d")[1] == timedelta(days=30)
    with pytest.raises(BadWindowError, match="24h, 7d, 30d"):
        parse_window("1y")


def test_compute_measures_each_span_from_its_own_start() -> None:
    recovered = IncidentTimes(
        incident_id="a",
        fault_at=at(0),
        detected_at=at(1),
        first_action_at=at(4),
        running_at=at(31),
        closed=True,
    )
    held = IncidentTimes(incident_id="b", detected_at=at(100), closed=True)
    open_ = IncidentTimes(incident_id="c", fault_at=at(200), detected_at=at(200.5))
    k = compute(
        "24h",
        by_category={"network": 1, "gpu_hardware": 2},
        detection_latencies=[1.0, 0.5, -3.0],
        times=[recovered, held, open_],
        restarts=1,
        now=at(260),
    )
    assert k.incidents == 3
    assert list(k.by_category) == ["gpu_hardware", "network"]  # most first
    assert k.detection_latency.count == 2 and k.detection_latency.p50 == 0.75  # negatives out
    assert k.detect_to_action.count == 1 and k.detect_to_action.p50 == 3.0
    assert k.fault_to_running.count == 1 and k.fault_to_running.p50 == 31.0
    # recovered: 31 s; held and closed: not counted; still open: fault -> now = 60 s
    assert k.time_lost_s == pytest.approx(91.0)
    assert k.restarts == 1


def test_time_lost_falls_back_to_detection_time() -> None:
    t = IncidentTimes(incident_id="x", detected_at=at(10), running_at=at(70), closed=True)
    assert time_lost([t], at(1000)) == 60.0


def test_human_duration() -> None:
    assert human_duration(None) == "–"
    assert human_duration(0.234) == "0.23 s"
    assert human_duration(42.0) == "42.0 s"
    assert human_duration(245) == "4m05s"
    assert human_duration(3 * 3600 + 720) == "3h12m"
    assert human_duration(52 * 3600) == "2d04h"
