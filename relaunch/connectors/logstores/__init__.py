"""Log stores beyond job files: Grafana Loki and VictoriaLogs, behind one ``fetch``."""

from __future__ import annotations

from collections.abc import Mapping

from relaunch.connectors.logstores.base import (
    LogLine,
    LogSelector,
    LogStore,
    job_selector,
    node_selector,
)
from relaunch.connectors.logstores.bundle_logs import fetch_evidence_logs
from relaunch.connectors.logstores.loki import LokiStore
from relaunch.connectors.logstores.victorialogs import VictoriaLogsStore
from relaunch.models.logstore import LogBackend, LogStoreSettings

__all__ = [
    "LogLine",
    "LogSelector",
    "LogStore",
    "LokiStore",
    "VictoriaLogsStore",
    "fetch_evidence_logs",
    "job_selector",
    "node_selector",
    "open_log_store",
]


def open_log_store(
    settings: LogStoreSettings, *, environ: Mapping[str, str] | None = None
) -> LogStore | None:
    """The store the settings name, or None for ``files`` (logs are read from disk)."""
    if settings.backend is LogBackend.LOKI:
        return LokiStore(settings, environ=environ)
    if settings.backend is LogBackend.VICTORIALOGS:
        return VictoriaLogsStore(settings, environ=environ)
    return None
