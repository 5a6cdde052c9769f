"""A cluster's recent history of recommendations, written into a real audit trail the way the
recoveries, node decisions and lifecycles write it (tests/support/audit_trail.py's ``Trail``),
for the console's scorecard page and metrics and their screenshot.

Cluster ``cluster``'s scorecard (restart window 600 s, a promotion at 3 decisions and 95%):

- network on partition ib: three approved drains the node's checks confirmed → promote network;
- gpu_hardware: an approved drain of a node that then passed its diagnosis (wrong), a rejected
  one on ib, an approved one on gpu not diagnosed yet (pending);
- hang, promoted to autonomous by ``ops``: a restart that failed the same way 100 s later
  (wrong: demote hang), one that ran the window out (right), and the failure that came back;
- a hold the user then cancelled (right);
- an application restart that expired while someone drained its node by hand (acted
  differently);
- ``hostile``: a recommendation whose category and partition, and a drain reason, are markup.

Totals: 13 recommendations; 5 approved, 1 rejected, 1 acted differently, 2 autonomous, 4 not
asked; 3 of 7 decisions approved and right; drains 3 right / 1 wrong / 1 pending, restarts
1 / 1 / 0, holds 1 / 0 / 0.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from relaunch.connectors.audit import AuditStore
from relaunch.models.config import ClusterConfig
from relaunch.models.recovery import Mode
from relaunch.models.rollout import RolloutSettings, ScopeKind
from relaunch.rollout.policy import change_mode
from tests.support.audit_trail import Trail

HOSTILE_CATEGORY = "<script>alert('category')</script>"
HOSTILE_PARTITION = "<script>alert('partition')</script>"
HOSTILE_REASON = "<script>alert('why')</script>"
SETTINGS = RolloutSettings(restart_ok_after_s=600, promote_min_decisions=3, promote_min_share=0.95)


def scorecard_config(name: str, database_url: str, bundle_dir: str) -> ClusterConfig:
    return ClusterConfig(
        name=name, database_url=database_url, bundle_dir=bundle_dir, rollout=SETTINGS
    )


@dataclass
class Story:
    network: list[str]  # the three approved network drains
    hang_wrong: str  # the autonomous restart that failed the same way again
    newest: str  # the most recent recommendation (gpu_hardware on gpu, not diagnosed yet)


async def write_story(url: str, cluster: str, *, hostile: bool = True) -> Story:
    now = datetime.now(UTC)

    def ago(seconds: float) -> datetime:
        return now - timedelta(seconds=seconds)

    store = await AuditStore.open(url)
    try:
        t = Trail(store, cluster)
        await change_mode(
            store, cluster, ScopeKind.CATEGORY, "hang", Mode.AUTONOMOUS, by="ops",
            reason="20 of 20 hang restarts right in staging",
        )  # fmt: skip
        network = [
            await t.node_decision(node, ago(3000 - i), category="network", partition="ib")
            for i, node in enumerate(("m1", "m2", "m3"))
        ]
        await t.node_decision(
            "m4", ago(2900), category="gpu_hardware", partition="ib", diagnose_passed=True
        )
        await t.node_decision(
            "m5", ago(2800), category="gpu_hardware", partition="ib", answer="reject"
        )
        hang_wrong = await t.recovery(
            "30", 0, ago(2500), category="hang", partition="cpu", action="restart",
            mode="autonomous",
        )  # fmt: skip
        await t.recovery("30", 1, ago(2400), category="hang", partition="cpu", action="none")
        await t.recovery(
            "31", 0, ago(2300), category="hang", partition="cpu", action="restart",
            mode="autonomous",
        )  # fmt: skip
        await t.recovery("40", 0, ago(2200), category="unknown", partition="cpu", action="hold")
        await t.recovery("40", 1, ago(2100), category="user_cancel", partition="cpu", action="none")
        if hostile:
            await t.recovery(
                "50", 0, ago(2000), category=HOSTILE_CATEGORY, partition=HOSTILE_PARTITION,
                action="none",
            )  # fmt: skip
        else:
            await t.recovery(
                "50", 0, ago(2000), category="preemption", partition="cpu", action="none"
            )
        await t.recovery(
            "60", 0, ago(1900), category="application", partition="gpu", action="restart",
            answer="expire", nodes=["x1"],
        )  # fmt: skip
        reason = HOSTILE_REASON if hostile else "NHC: ib0 down"
        await t.row(f"intake-{cluster}", "external_drain", ago(1890), nodes=["x1"], reason=reason)
        newest = await t.node_decision(
            "m6", ago(60), category="gpu_hardware", partition="gpu", diagnose_passed=None
        )
        return Story(network=network, hang_wrong=hang_wrong, newest=newest)
    finally:
        await store.close()


async def write_other_cluster(url: str, cluster: str) -> list[str]:
    """Another cluster's: two approved node_failure drains on partition bpart the checks
    confirmed, and a rejected one."""
    now = datetime.now(UTC)
    store = await AuditStore.open(url)
    try:
        t = Trail(store, cluster)
        made = [
            await t.node_decision(
                node, now - timedelta(seconds=900 - i), category="node_failure", partition="bpart"
            )
            for i, node in enumerate(("k1", "k2"))
        ]
        await t.node_decision(
            "k3",
            now - timedelta(seconds=800),
            category="node_failure",
            partition="bpart",
            answer="reject",
        )
        return made
    finally:
        await store.close()
