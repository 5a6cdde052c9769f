"""Helpers every telemetry source shares: throttle bits, PCI addresses, and the change filter
that keeps a node agent from repeating itself every tick."""

from __future__ import annotations

import re

from relaunch.models.bundle import TelemetrySample, TelemetrySource

# nvmlClocksEventReason* / nvmlClocksThrottleReason* bits (nvml.h); DCGM's
# DCGM_FI_DEV_CLOCK_THROTTLE_REASONS carries the same mask. Only the reasons that mean the GPU
# is being slowed against the job's will: idle, application clocks and sync boost are not news.
THROTTLE_REASONS: tuple[tuple[int, str], ...] = (
    (0x0000000000000004, "sw_power_cap"),
    (0x0000000000000008, "hw_slowdown"),
    (0x0000000000000020, "sw_thermal"),
    (0x0000000000000040, "hw_thermal"),
    (0x0000000000000080, "hw_power_brake"),
)

# Counters whose increase is news. Volatile counters fall back to 0 when the driver reloads;
# a decrease is remembered but not reported.
COUNTERS = (
    "ecc_dbe_volatile",
    "ecc_dbe_aggregate",
    "remapped_rows_uncorrectable",
    "remapped_rows_correctable",
    "retired_pages_dbe",
    "nvlink_errors",
)
FLAGS = ("remapped_rows_pending", "remapped_rows_failure", "retired_pages_pending")

_PCI = re.compile(
    r"(?:(?P<domain>[0-9A-Fa-f]{1,8}):)?(?P<bus>[0-9A-Fa-f]{2}):(?P<dev>[0-9A-Fa-f]{2})"
    r"(?:\.(?P<fn>[0-7]))?"
)


def throttle_reasons(mask: int) -> list[str]:
    """The named slowdown reasons set in an NVML/DCGM clocks-event mask, in a fixed order."""
    return [name for bit, name in THROTTLE_REASONS if mask & bit]


def pci_key(bus_id: str) -> str | None:
    """A PCI address in one spelling, so that NVML's ``00000000:07:00.0``, DCGM's label and the
    kernel's ``PCI:0000:07:00`` compare equal: ``dddd:bb:dd`` in lower case, function dropped.
    None when ``bus_id`` is not a PCI address."""
    found = _PCI.fullmatch(bus_id.strip().removeprefix("PCI:"))
    if not found:
        return None
    domain = int(found.group("domain") or "0", 16)
    return f"{domain:04x}:{found.group('bus').lower()}:{found.group('dev').lower()}"


class ChangeFilter:
    """Decides which samples are news, per (node, gpu, source).

    The first sample of each GPU is news; after that a sample is news when it carries an Xid
    event, a counter went up, a flag turned on, a throttle reason or an error appeared, or the
    GPU's identity changed. DCGM's Xid field is the *last* Xid seen, a level rather than an
    event, so it is news only when it differs from the previous reading. The filter always
    remembers the latest reading, news or not.
    """

    def __init__(self) -> None:
        self._last: dict[tuple[str, int | None, str | None], TelemetrySample] = {}

    def news(self, samples: list[TelemetrySample]) -> list[TelemetrySample]:
        """The samples among ``samples`` worth sending, in order."""
        return [s for s in samples if self.is_news(s)]

    def is_news(self, sample: TelemetrySample) -> bool:
        """Whether ``sample`` is news; it becomes the reference for the next one either way."""
        key = (sample.node, sample.gpu, sample.source.value if sample.source else None)
        prev = self._last.get(key)
        self._last[key] = sample
        if sample.source is TelemetrySource.KERNEL:
            return True
        if prev is None:
            return True
        if sample.xid is not None and (
            sample.source is not TelemetrySource.DCGM or sample.xid != prev.xid
        ):
            return True
        for name in COUNTERS:
            now, before = getattr(sample, name), getattr(prev, name)
            if now is not None and (before is None or now > before):
                return True
        for name in FLAGS:
            if getattr(sample, name) and not getattr(prev, name):
                return True
        if set(sample.throttle or ()) - set(prev.throttle or ()):
            return True
        if set(sample.errors or ()) - set(prev.errors or ()):
            return True
        return (sample.uuid, sample.pci_bus_id) != (prev.uuid, prev.pci_bus_id)
