"""The scorecard's series on ``/metrics``: each served cluster's scorecard over its configured
window (``rollout.window_days``), read from the audit trail and shared for 15 s with the
scorecard page and the API (``scorecard_of``). They are gauges, not counters: a recommendation
moves from ``pending`` to its answer and an action from ``pending`` to ``right`` or ``wrong``,
and both leave the window as it moves on, so a series goes down as well as up."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from datetime import datetime

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from relaunch.console.queries import ConsoleDb
from relaunch.models.config import ClusterConfig
from relaunch.models.rollout import Outcome, Scorecard
from relaunch.rollout.scorecard import load_scorecard

SCORECARD_TTL_S = 15.0
_JUDGED = (Outcome.RIGHT, Outcome.WRONG, Outcome.PENDING)


def _key(cluster: str) -> tuple[str, str]:
    return ("scorecard", cluster)


async def scorecard_of(
    db: ConsoleDb, config: ClusterConfig, since: datetime | None = None
) -> Scorecard:
    """A cluster's scorecard. Over the configured window (``since`` None) it is shared by the
    page, the API and ``/metrics`` for ``SCORECARD_TTL_S`` (like the overview's window KPIs:
    a judgement over 30 days of rows, about 1-2 s at 10,000 incidents); any other window is
    read fresh."""
    if since is not None:
        return await db.from_store(lambda store: load_scorecard(store, config, since=since))
    return await db.cached(
        _key(config.name),
        SCORECARD_TTL_S,
        lambda: db.from_store(lambda store: load_scorecard(store, config)),
    )


def forget_scorecard(db: ConsoleDb, cluster: str) -> None:
    """Drop the shared scorecard of ``cluster`` (a mode change made here shows at once)."""
    db.forget(_key(cluster))


async def scorecards(db: ConsoleDb, configs: Sequence[ClusterConfig]) -> dict[str, Scorecard]:
    """The scorecard of each of ``configs``' clusters over its configured window."""
    return {config.name: await scorecard_of(db, config) for config in configs}


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
