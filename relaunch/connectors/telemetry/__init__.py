"""GPU and kernel telemetry: the NVML node agent's collector, dcgm-exporter, the kernel log,
and the JSONL files that carry samples from the agents to the watcher.

The watcher's entry point is :class:`TelemetryTail` (one per node file); ``nvml``, ``dcgm``
and ``kernlog`` are imported on their own so that reading files needs no GPU library.
"""

from relaunch.connectors.telemetry.files import (
    TelemetryTail,
    append_samples,
    attempt_samples,
    read_job_telemetry,
)
from relaunch.connectors.telemetry.samples import ChangeFilter, pci_key, throttle_reasons

__all__ = [
    "ChangeFilter",
    "TelemetryTail",
    "append_samples",
    "attempt_samples",
    "pci_key",
    "read_job_telemetry",
    "throttle_reasons",
]
