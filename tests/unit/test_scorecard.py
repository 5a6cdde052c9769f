"""The scorecard on a real audit trail (an embedded PostgreSQL): recommendations written as the
workflows write them, each number of the scorecard checked, the suggestions, and the audited mode
changes the planning activities lay over the configuration."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from relaunch.connectors.audit import AuditStore
from relaunch.models.config import ClusterConfig
from relaunch.models.errors import RelaunchError
from relaunch.models.recovery import Category, Mode, Policy
from relaunch.models.rollout import (
    ActionKind,
    Outcome,
    Response,
    RolloutSettings,
    ScopeKind,
    Scorecard,
)
from relaunch.rollout.policy import PolicyCache, change_mode, effective_policy, mode_changes
from relaunch.rollout.scorecard import load_scorecard
from tests.support.audit_trail import Trail
from tests.support.postgres import embedded_postgres

NOW = datetime.now(UTC)
WINDOW_S = 600.0


@pytest.fixture(scope="module")
def pg_url() -> Iterator[str]:
    with embedded_postgres("relaunch-scorecard-") as url:
        yield url


def config(cluster: str, policy: Policy | None = None) -> ClusterConfig:
    return ClusterConfig(
        name=cluster,
        database_url="postgresql://unused",
        bundle_dir="/tmp",
        policy=policy or Policy(),
        rollout=RolloutSettings(
            restart_ok_after_s=WINDOW_S, promote_min_decisions=3, promote_min_share=0.95
        ),
    )


def ago(seconds: float) -> datetime:
    return NOW - timedelta(seconds=seconds)


async def scorecard(url: str, cfg: ClusterConfig, build: Any) -> Scorecard:
    store = await AuditStore.open(url)
    try:
        await build(Trail(store, cfg.name))
        return await load_scorecard(store, cfg, since=NOW - timedelta(days=1), now=NOW)
    finally:
        await store.close()


def test_every_number_of_a_mixed_history(pg_url: str) -> None:
    """Approvals, a rejection, an expiry, operators acting differently, holds and an
    autonomous mistake: each count of the scorecard as the rules say."""
    cfg = config("mix", Policy(category_modes={Category.HANG: Mode.AUTONOMOUS}))

    async def build(t: Trail) -> None:
        # gpu_hardware on partition gpu: an approved drain the checks confirmed (its job ran the
        # window out after the requeue), an approved drain of a node that then passed its
        # diagnosis, a rejection, an expiry; one approved whose checks have not run.
        await t.node_decision("n1", ago(3600), category="gpu_hardware", partition="gpu", job="10")
        await t.node_decision(
            "n2", ago(3000), category="gpu_hardware", partition="gpu", diagnose_passed=True
        )
        await t.node_decision(
            "n3", ago(2900), category="gpu_hardware", partition="gpu", answer="reject"
        )
        await t.node_decision(
            "n4", ago(2800), category="gpu_hardware", partition="gpu", answer="expire"
        )
        await t.node_decision(
            "n5", ago(60), category="gpu_hardware", partition="gpu", diagnose_passed=None
        )
        # A recommended restart that expired while the operator drained the job's node himself.
        await t.recovery(
            "20", 0, ago(2500), category="network", partition="gpu", action="restart",
            answer="expire", nodes=["n6"],
        )  # fmt: skip
        await t.row("intake-mix", "external_drain", ago(2490), nodes=["n6"], reason="NHC: ib0")
        # A recommended restart nobody answered before the user cancelled the job.
        await t.recovery(
            "21", 0, ago(2400), category="network", partition="cpu", action="restart",
            nodes=["n7"],
        )  # fmt: skip
        await t.recovery("21", 1, ago(2350), category="user_cancel", partition="cpu", action="none")
        # Autonomous hang restarts: one failed the same way 100 s later (wrong), one ran the
        # window out (right).
        await t.recovery(
            "30", 0, ago(2000), category="hang", partition="cpu", action="restart",
            mode="autonomous",
        )  # fmt: skip
        await t.recovery("30", 1, ago(1900), category="hang", partition="cpu", action="none")
        await t.recovery(
            "31", 0, ago(1800), category="hang", partition="cpu", action="restart",
            mode="autonomous",
        )  # fmt: skip
        # One never seen running again: pending however long ago.
        await t.recovery(
            "32", 0, ago(1750), category="hang", partition="cpu", action="restart",
            mode="autonomous", verified=False,
        )  # fmt: skip
        # Holds (no approval asked): one job cancelled after it (right), one left alone (wrong).
        await t.recovery("40", 0, ago(1700), category="unknown", partition="cpu", action="hold")
        await t.recovery("40", 1, ago(1600), category="user_cancel", partition="cpu", action="none")
        await t.recovery("41", 0, ago(1500), category="unknown", partition="cpu", action="hold")

    card = asyncio.run(scorecard(pg_url, cfg, build))
    assert len(card.recommendations) == 15, [r.incident_id for r in card.recommendations]
    t = card.total
    assert (t.recommended, t.approved, t.rejected, t.expired) == (15, 3, 1, 1)
    assert (t.acted_differently, t.pending, t.autonomous, t.not_asked) == (2, 0, 3, 5)
    assert (t.approved_right, t.approved_wrong, t.autonomous_wrong) == (1, 1, 1)
    # Drains: n1 right, n2 wrong, n5 pending. Restarts: job 10 (by n1's decision) right, job
    # 30 wrong, job 31 right, job 32 pending. Holds: 40 right, 41 wrong.
    assert card.drains.model_dump() == {"right": 1, "wrong": 1, "pending": 1}
    assert card.restarts.model_dump() == {"right": 2, "wrong": 1, "pending": 1}
    assert card.holds.model_dump() == {"right": 1, "wrong": 1, "pending": 0}
    assert card.drains.precision == 0.5
    assert card.restarts.precision == pytest.approx(2 / 3)
    responses = {r.incident_id: r.response for r in card.recommendations}
    assert responses["relaunch-mix-20-0"] is Response.ACTED_DIFFERENTLY
    assert responses["relaunch-mix-21-0"] is Response.ACTED_DIFFERENTLY
    assert "n6 drained by someone else (NHC: ib0)" in next(
        r.why for r in card.recommendations if r.incident_id == "relaunch-mix-20-0"
    )
    gpu = next(c for c in card.categories if c.name == "gpu_hardware")
    assert (gpu.tally.recommended, gpu.tally.decided, gpu.tally.approved_right) == (5, 5, 1)
    assert gpu.tally.approved == 3 and gpu.tally.pending == 0
    assert gpu.drains.model_dump() == {"right": 1, "wrong": 1, "pending": 1}
    assert gpu.restarts.model_dump() == {"right": 1, "wrong": 0, "pending": 0}
    hang = next(c for c in card.categories if c.name == "hang")
    assert hang.mode is Mode.AUTONOMOUS and hang.tally.autonomous == 3
    assert hang.restarts.model_dump() == {"right": 1, "wrong": 1, "pending": 1}
    cpu = next(c for c in card.partitions if c.name == "cpu")
    assert cpu.tally.recommended == 9 and cpu.holds.right == 1 and cpu.holds.wrong == 1
    # The wrong autonomous restart of a hang suggests demoting hang (its own mode made it
    # autonomous); nothing has earned a promotion (gpu_hardware: 1 of 5 approved and right).
    assert [(s.change, s.scope, s.name, s.to) for s in card.suggestions] == [
        ("demote", ScopeKind.CATEGORY, "hang", Mode.MONITOR)
    ]
    assert card.suggestions[0].incidents == ["relaunch-mix-30-0"]
    kinds = {(j.incident_id, j.action): j.outcome for j in card.judged}
    assert kinds[("relaunch-mix-10-0", ActionKind.RESTART)] is Outcome.RIGHT


def test_promotion_when_the_bar_is_met_and_not_after(pg_url: str) -> None:
    """Three approved drains the checks confirmed pass a bar of 3 at 95%: promote network.
    After the promotion the scope runs autonomous and the suggestion is gone."""
    cfg = config("promo")

    async def build(t: Trail) -> None:
        for i, node in enumerate(("m1", "m2", "m3")):
            await t.node_decision(node, ago(900 - i), category="network", partition="ib")
        await t.node_decision("m4", ago(800), category="gpu_hardware", partition="ib")

    card = asyncio.run(scorecard(pg_url, cfg, build))
    suggested = {(s.change, s.scope, s.name) for s in card.suggestions}
    assert suggested == {
        ("promote", ScopeKind.CATEGORY, "network"),
        ("promote", ScopeKind.PARTITION, "ib"),  # 4 of 4 approved and right there
    }
    network = next(s for s in card.suggestions if s.name == "network")
    assert network.why.startswith("3 of 3 decisions approved and right (100% ≥ 95%")

    async def promote_then_look() -> Scorecard:
        store = await AuditStore.open(pg_url)
        try:
            await change_mode(
                store, "promo", ScopeKind.CATEGORY, "network", Mode.AUTONOMOUS, by="ana",
                reason="3 of 3",
            )  # fmt: skip
            return await load_scorecard(store, cfg, since=NOW - timedelta(days=1), now=NOW)
        finally:
            await store.close()

    after = asyncio.run(promote_then_look())
    assert next(c for c in after.categories if c.name == "network").mode is Mode.AUTONOMOUS
    assert {s.name for s in after.suggestions} == {"ib"}


def test_mode_changes_are_audited_and_laid_over_the_configuration(pg_url: str) -> None:
    async def go() -> None:
        store = await AuditStore.open(pg_url)
        try:
            cache = PolicyCache(store, "roll")
            base = Policy(partition_modes={"batch": Mode.AUTONOMOUS})
            assert (await cache.apply(base)) == base
            await change_mode(
                store, "roll", ScopeKind.CATEGORY, "gpu_hardware", Mode.AUTONOMOUS, by="ana"
            )
            await change_mode(store, "roll", ScopeKind.PARTITION, "batch", Mode.MONITOR, by="bo")
            changes = await mode_changes(store, "roll")
            assert [(c.name, c.mode, c.by) for c in changes] == [
                ("gpu_hardware", Mode.AUTONOMOUS, "ana"),
                ("batch", Mode.MONITOR, "bo"),
            ]
            policy = effective_policy(base, changes)
            assert policy.mode_for("gpu", Category.GPU_HARDWARE) is Mode.AUTONOMOUS
            assert policy.mode_for("batch", Category.NETWORK) is Mode.MONITOR
            # Back to the configuration: batch autonomous again.
            await change_mode(store, "roll", ScopeKind.PARTITION, "batch", None, by="bo")
            policy = effective_policy(base, await mode_changes(store, "roll"))
            assert policy.mode_for("batch", Category.NETWORK) is Mode.AUTONOMOUS
            with pytest.raises(RelaunchError, match="no category 'gpu'"):
                await change_mode(store, "roll", ScopeKind.CATEGORY, "gpu", Mode.MONITOR, by="x")
            with pytest.raises(RelaunchError):
                await change_mode(
                    store, "roll", ScopeKind.PARTITION, "a b;rm", Mode.MONITOR, by="x"
                )
            rows = await store.events("rollout-roll")
            assert [r.kind for r in rows] == ["mode_change"] * 3
            assert rows[0].actor == "ana"
            # A rollout record is not a recovery: the incident lists leave it out.
            assert not [i for i in await store.incidents(cluster="roll") if i.id.startswith("r")]
        finally:
            await store.close()

    asyncio.run(go())


def test_canary_partition_is_the_only_autonomous_one() -> None:
    policy = Policy(mode=Mode.AUTONOMOUS, canary_partition="canary")
    assert policy.mode_for("canary", Category.GPU_HARDWARE) is Mode.AUTONOMOUS
    assert policy.mode_for("debug", Category.GPU_HARDWARE) is Mode.MONITOR
    assert not policy.acts_alone(["canary", "debug"], Category.GPU_HARDWARE)
    assert policy.acts_alone(["canary"], Category.GPU_HARDWARE)
    # A canary does not make a monitor cluster act.
    assert Policy(canary_partition="canary").mode_for("canary", Category.HANG) is Mode.MONITOR
    # A promoted partition or category acts beyond the canary; a demoted one stops on it.
    promoted = policy.model_copy(
        update={
            "partition_modes": {"debug": Mode.AUTONOMOUS},
            "category_modes": {Category.HANG: Mode.MONITOR},
        }
    )
    assert promoted.mode_for("debug", Category.GPU_HARDWARE) is Mode.AUTONOMOUS
    assert promoted.mode_for("canary", Category.HANG) is Mode.MONITOR
    assert promoted.mode_for("other", Category.GPU_HARDWARE) is Mode.MONITOR
