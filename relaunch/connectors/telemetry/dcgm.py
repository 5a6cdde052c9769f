"""GPU health from dcgm-exporter: its Prometheus text exposition turned into samples.

:func:`parse_exposition` parses the text format (``# HELP``/``# TYPE`` comments, escaped label
values, optional timestamps, ``NaN``/``+Inf``); :func:`samples_from_metrics` groups the health
fields per GPU; :class:`DcgmScraper` fetches ``/metrics`` over HTTP with a timeout.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from datetime import UTC, datetime
from typing import NamedTuple

import httpx

from relaunch.connectors.telemetry.samples import throttle_reasons
from relaunch.models.bundle import TelemetrySample, TelemetrySource
from relaunch.models.errors import RelaunchError

DEFAULT_TIMEOUT = 5.0
# DCGM marks a value it does not have with "blank" sentinels at the top of the int64 range
# (DCGM_INT64_BLANK = 0x7ffffffffffffff0 and up); as a float they all read as ~9.22e18.
_BLANK_FLOOR = float(0x7FFFFFFFFFFFFFF0) - 1024


class DcgmError(RelaunchError):
    """dcgm-exporter could not be reached or answered with something unusable."""

    retryable = True


class Metric(NamedTuple):
    """One sample line of the exposition."""

    name: str
    labels: dict[str, str]
    value: float
    timestamp_ms: int | None = None


class ExpositionError(ValueError):
    """A line that is not in the Prometheus text format."""


def parse_exposition(text: str) -> list[Metric]:
    """Every sample line of a Prometheus text exposition, in order. Comments are skipped;
    a malformed line raises ExpositionError naming its line number."""
    out: list[Metric] = []
    for no, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        try:
            out.append(_parse_line(line))
        except (ValueError, IndexError) as exc:
            raise ExpositionError(f"line {no}: {exc}: {line[:120]!r}") from None
    return out


def _parse_line(line: str) -> Metric:
    end = 0
    while end < len(line) and (line[end].isalnum() or line[end] in "_:"):
        end += 1
    name = line[:end]
    if not name or name[0].isdigit():
        raise ValueError("no metric name")
    labels: dict[str, str] = {}
    pos = end
    if pos < len(line) and line[pos] == "{":
        labels, pos = _parse_labels(line, pos + 1)
    rest = line[pos:].split()
    if not rest or len(rest) > 2:
        raise ValueError("expected a value and an optional timestamp")
    value = _parse_value(rest[0])
    stamp = int(rest[1]) if len(rest) == 2 else None
    return Metric(name, labels, value, stamp)


def _parse_labels(line: str, pos: int) -> tuple[dict[str, str], int]:
    labels: dict[str, str] = {}
    while True:
        while line[pos] in " \t,":
            pos += 1
        if line[pos] == "}":
            return labels, pos + 1
        eq = line.index("=", pos)
        key = line[pos:eq].strip()
        if not key:
            raise ValueError("empty label name")
        pos = eq + 1
        while line[pos] in " \t":
            pos += 1
        if line[pos] != '"':
            raise ValueError(f"label {key} has no quoted value")
        pos += 1
        chars: list[str] = []
        while line[pos] != '"':
            ch = line[pos]
            if ch == "\\":
                nxt = line[pos + 1]
                chars.append({"n": "\n", "\\": "\\", '"': '"'}.get(nxt, "\\" + nxt))
                pos += 2
            else:
                chars.append(ch)
                pos += 1
        labels[key] = "".join(chars)
        pos += 1


def _parse_value(text: str) -> float:
    lowered = text.lower()
    if lowered in ("nan", "+inf", "-inf", "inf"):
        return float(lowered)
    return float(text)


# DCGM field -> sample field; counters and flags as dcgm-exporter names them.
_INT_FIELDS = {
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": "ecc_dbe_volatile",
    "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL": "ecc_dbe_aggregate",
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": "remapped_rows_uncorrectable",
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": "remapped_rows_correctable",
    "DCGM_FI_DEV_RETIRED_DBE": "retired_pages_dbe",
}
_FLAG_FIELDS = {
    "DCGM_FI_DEV_ROW_REMAP_FAILURE": "remapped_rows_failure",
    "DCGM_FI_DEV_ROW_REMAP_PENDING": "remapped_rows_pending",
    "DCGM_FI_DEV_RETIRED_PENDING": "retired_pages_pending",
}
_NVLINK_FIELDS = frozenset(
    {
        "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL",
        "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL",
        "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL",
        "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL",
    }
)
_THROTTLE_FIELDS = frozenset(
    {"DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", "DCGM_FI_DEV_CLOCKS_EVENT_REASONS"}
)
_XID_FIELD = "DCGM_FI_DEV_XID_ERRORS"


def samples_from_metrics(
    metrics: list[Metric],
    *,
    node: str | None = None,
    time: datetime | None = None,
) -> list[TelemetrySample]:
    """One sample per (node, GPU) from dcgm-exporter's metrics.

    The node is ``node`` when given (the scraper knows which host it asked), else the
    ``Hostname`` label (``hostname`` from dcgm-exporter 4.8.3 on). Metrics without a ``gpu``
    label (NVSwitch, CPU entities) and blank or NaN values are left out. MIG instances of one
    GPU merge into that GPU's sample (the health fields are per device).
    """
    stamp = time or datetime.now(UTC)
    by_gpu: dict[tuple[str, int], TelemetrySample] = {}
    for metric in metrics:
        gpu_label = metric.labels.get("gpu", "")
        host = node or metric.labels.get("Hostname") or metric.labels.get("hostname")
        if not gpu_label.isdigit() or not host:
            continue
        key = (host, int(gpu_label))
        sample = by_gpu.get(key)
        if sample is None:
            sample = by_gpu[key] = TelemetrySample(
                node=host, gpu=key[1], time=stamp, source=TelemetrySource.DCGM
            )
        sample.uuid = sample.uuid or metric.labels.get("UUID") or None
        sample.pci_bus_id = sample.pci_bus_id or metric.labels.get("pci_bus_id") or None
        value = metric.value
        if math.isnan(value) or math.isinf(value) or value >= _BLANK_FLOOR or value < 0:
            continue
        name = metric.name
        if name == _XID_FIELD:
            if value > 0:
                sample.xid = int(value)
        elif name in _INT_FIELDS:
            setattr(sample, _INT_FIELDS[name], int(value))
        elif name in _FLAG_FIELDS:
            setattr(sample, _FLAG_FIELDS[name], value > 0)
        elif name in _NVLINK_FIELDS:
            sample.nvlink_errors = (sample.nvlink_errors or 0) + int(value)
        elif name in _THROTTLE_FIELDS:
            sample.throttle = throttle_reasons(int(value))
    return list(by_gpu.values())


class DcgmScraper:
    """Fetches and parses one dcgm-exporter's ``/metrics``.

    ``node`` names the host the exporter runs on (else its Hostname label is used)."""

    def __init__(
        self,
        url: str,
        *,
        node: str | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        client: httpx.AsyncClient | None = None,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.url = url
        self.node = node
        self.timeout = timeout
        self._client = client
        self._clock = clock

    async def scrape(self) -> list[TelemetrySample]:
        """The current samples; DcgmError when the exporter cannot be read."""
        try:
            if self._client is not None:
                response = await self._client.get(self.url, timeout=self.timeout)
            else:
                async with httpx.AsyncClient(timeout=self.timeout) as client:
                    response = await client.get(self.url)
        except httpx.HTTPError as exc:
            raise DcgmError(f"dcgm-exporter at {self.url}: {type(exc).__name__}") from exc
        if response.status_code != 200:
            raise DcgmError(f"dcgm-exporter at {self.url}: HTTP {response.status_code}")
        try:
            metrics = parse_exposition(response.text)
        except ExpositionError as exc:
            raise DcgmError(f"dcgm-exporter at {self.url}: {exc}") from exc
        return samples_from_metrics(metrics, node=self.node, time=self._clock())
