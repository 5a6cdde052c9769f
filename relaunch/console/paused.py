"""The console's ``relaunch_paused{cluster}`` series: 1 while a served cluster is paused
(`relaunch pause`), 0 otherwise, from the state the background reads every few seconds."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from relaunch.models.config import ClusterConfig
from relaunch.models.pause import PauseState


class _Paused(Collector):
    def __init__(self, clusters: Sequence[str], pauses: Mapping[str, PauseState]) -> None:
        self.clusters, self.pauses = clusters, pauses

    def collect(self) -> Iterable[Metric]:
        gauge = GaugeMetricFamily(
            "relaunch_paused",
            "1 while the cluster is paused (relaunch pause): Relaunch changes nothing on it.",
            labels=["cluster"],
        )
        for name in self.clusters:
            state = self.pauses.get(name)
            if state is not None:  # not read yet: no sample rather than a guess
                gauge.add_metric([name], 1.0 if state.paused else 0.0)
        yield gauge


def paused_series(configs: Sequence[ClusterConfig], pauses: Mapping[str, PauseState]) -> bytes:
    """The series in Prometheus' text format, for the served clusters in ``configs``."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Paused([c.name for c in configs], pauses))
    return generate_latest(registry)
