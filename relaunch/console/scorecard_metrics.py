"""The scorecard's series on ``/metrics``: each served cluster's scorecard over its configured
window (``rollout.window_days``), read from the audit trail at scrape time and shared for a few
seconds. They are gauges, not counters: a recommendation moves from ``pending`` to its answer
and an action from ``pending`` to ``right`` or ``wrong``, and both leave the window as it moves
on, so a series goes down as well as up."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from relaunch.console.queries import ConsoleDb
from relaunch.models.config import ClusterConfig
from relaunch.models.rollout import Outcome, Scorecard
from relaunch.rollout.scorecard import load_scorecard

SCORECARD_TTL_S = 5.0
_JUDGED = (Outcome.RIGHT, Outcome.WRONG, Outcome.PENDING)


async def _scorecard(db: ConsoleDb, config: ClusterConfig) -> Scorecard:
    return await db.cached(
        ("metrics-scorecard", config.name),
        SCORECARD_TTL_S,
        lambda: db.from_store(lambda store: load_scorecard(store, config)),
    )


async def scorecards(db: ConsoleDb, configs: Sequence[ClusterConfig]) -> dict[str, Scorecard]:
    """The scorecard of each of ``configs``' clusters, each shared for ``SCORECARD_TTL_S``."""
    return {config.name: await _scorecard(db, config) for config in configs}


class ScorecardCollector(Collector):
    """The metric families of the served clusters' scorecards."""

    def __init__(self, cards: dict[str, Scorecard]) -> None:
        self.cards = cards

    def collect(self) -> Iterable[Metric]:
        recs = GaugeMetricFamily(
            "relaunch_recommendations",
            "Recommendations (plans) in the scorecard's window, by the incident's category, "
            "the partition and what operators did with them.",
            labels=["cluster", "category", "partition", "response"],
        )
        judged = GaugeMetricFamily(
            "relaunch_actions_judged",
            "Drains, restarts and holds carried out in the scorecard's window, by outcome "
            "(right, wrong, or pending: not judged yet).",
            labels=["cluster", "action", "outcome"],
        )
        suggestions = GaugeMetricFamily(
            "relaunch_rollout_suggestions",
            "Promotions and demotions the scorecard suggests now (1 each).",
            labels=["cluster", "change", "scope", "name"],
        )
        for cluster, card in self.cards.items():
            counts = Counter(
                (r.category, r.partition, r.response.value) for r in card.recommendations
            )
            for (category, partition, response), n in sorted(counts.items()):
                recs.add_metric([cluster, category, partition, response], float(n))
            for action, p in (
                ("drain", card.drains),
                ("restart", card.restarts),
                ("hold", card.holds),
            ):
                for outcome in _JUDGED:
                    judged.add_metric(
                        [cluster, action, outcome.value], float(getattr(p, outcome.value))
                    )
            suggested = Counter((s.change, s.scope.value, s.name) for s in card.suggestions)
            for (change, scope, name), n in sorted(suggested.items()):
                suggestions.add_metric([cluster, change, scope, name], float(n))
        yield recs
        yield judged
        yield suggestions
