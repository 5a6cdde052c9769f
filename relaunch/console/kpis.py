"""KPI arithmetic over one window of the audit trail (pure: the queries fetch, this counts)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from datetime import datetime, timedelta

from pydantic import BaseModel, Field

WINDOWS: dict[str, timedelta] = {
    "24h": timedelta(hours=24),
    "7d": timedelta(days=7),
    "30d": timedelta(days=30),
}


class BadWindowError(ValueError):
    """A ?window= value the console does not offer."""


def parse_window(value: str | None) -> tuple[str, timedelta]:
    key = value or "24h"
    if key not in WINDOWS:
        raise BadWindowError(f"window must be one of {', '.join(WINDOWS)}, not {key!r}")
    return key, WINDOWS[key]


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0–100) with linear interpolation between ranks; None when empty."""
    if not values:
        return None
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100.0
    low, high = math.floor(rank), math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


class Spread(BaseModel):
    """Median and p95 of a duration, in seconds, over ``count`` samples."""

    count: int = 0
    p50: float | None = None
    p95: float | None = None

    @classmethod
    def of(cls, values: Sequence[float]) -> Spread:
        return cls(count=len(values), p50=percentile(values, 50), p95=percentile(values, 95))


class IncidentTimes(BaseModel):
    """When one incident's milestones happened (None: not reached)."""

    incident_id: str
    fault_at: datetime | None = None
    detected_at: datetime | None = None
    first_action_at: datetime | None = None
    running_at: datetime | None = None
    closed: bool = False


class Kpis(BaseModel):
    window: str
    incidents: int = 0
    by_category: dict[str, int] = Field(default_factory=dict)
    detection_latency: Spread = Field(default_factory=Spread)
    detect_to_action: Spread = Field(default_factory=Spread)
    fault_to_running: Spread = Field(default_factory=Spread)
    restarts: int = 0
    time_lost_s: float = 0.0


def time_lost(times: Sequence[IncidentTimes], now: datetime) -> float:
    """Training time lost, in seconds: fault → running again for recovered jobs, fault → now for
    recoveries still open. Closed, unrecovered incidents (held, rejected, no action) are left
    out: when their job ran again is not Relaunch's to know."""
    total = 0.0
    for t in times:
        start = t.fault_at or t.detected_at
        if start is None:
            continue
        end = t.running_at or (None if t.closed else now)
        if end is not None and end > start:
            total += (end - start).total_seconds()
    return total


def compute(
    window: str,
    *,
    by_category: dict[str, int],
    detection_latencies: Sequence[float],
    times: Sequence[IncidentTimes],
    restarts: int,
    now: datetime,
) -> Kpis:
    to_action = [
        (t.first_action_at - t.detected_at).total_seconds()
        for t in times
        if t.detected_at and t.first_action_at and t.first_action_at >= t.detected_at
    ]
    to_running = [
        (t.running_at - start).total_seconds()
        for t in times
        if t.running_at and (start := t.fault_at or t.detected_at)
    ]
    return Kpis(
        window=window,
        incidents=len(times),
        by_category=dict(sorted(by_category.items(), key=lambda kv: (-kv[1], kv[0]))),
        detection_latency=Spread.of([v for v in detection_latencies if v >= 0]),
        detect_to_action=Spread.of(to_action),
        fault_to_running=Spread.of([v for v in to_running if v >= 0]),
        restarts=restarts,
        time_lost_s=time_lost(times, now),
    )


def human_duration(seconds: float | None) -> str:
    """1.23 s, 4m05s, 3h12m, 2d04h."""
    if seconds is None:
        return "–"
    if seconds < 60:
        return f"{seconds:.2f} s" if seconds < 10 else f"{seconds:.1f} s"
    minutes, sec = divmod(int(round(seconds)), 60)
    if minutes < 60:
        return f"{minutes}m{sec:02d}s"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours}h{minutes:02d}m"
    days, hours = divmod(hours, 24)
    return f"{days}d{hours:02d}h"
