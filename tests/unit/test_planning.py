"""The planner: the design's category → action map, budget, blast radius, never blaming a node
for an application error."""

from __future__ import annotations

import pytest

from relaunch.detection.planning import PlanHistory, drain_limit, make_plan
from relaunch.models.recovery import (
    Action,
    ActionPlan,
    Category,
    EvidenceSummary,
    JobSnapshot,
    Mode,
    Policy,
    Verdict,
)

EVIDENCE = EvidenceSummary(
    incident_id="i",
    bundle_path="/b",
    job=JobSnapshot(job_id="7", partition="gpu", nodes=["n1", "n2"], restart_count=2),
    unreachable_nodes=["n2"],
)


def plan(
    category: Category, culprits: list[str], policy: Policy | None = None, **history: object
) -> ActionPlan:
    verdict = Verdict(category=category, culprit_nodes=culprits, confidence=0.9, action=Action.NONE)
    return make_plan(
        request_id="r",
        verdict=verdict,
        evidence=EVIDENCE,
        policy=policy or Policy(),
        history=PlanHistory.model_validate({"partition_size": 40, **history}),
    )


@pytest.mark.parametrize(
    ("category", "culprits", "action"),
    [
        (Category.GPU_HARDWARE, ["n2"], Action.ISOLATE_AND_RESTART),
        (Category.NETWORK, ["n2"], Action.ISOLATE_AND_RESTART),
        (Category.NODE_FAILURE, ["n2"], Action.ISOLATE_AND_RESTART),
        (Category.HANG, ["n2"], Action.ISOLATE_AND_RESTART),
        (Category.HANG, [], Action.RESTART),
        (Category.INFRASTRUCTURE, [], Action.RESTART),
        (Category.APPLICATION, [], Action.HOLD),
        (Category.PREEMPTION, [], Action.NONE),
        (Category.TIME_LIMIT, [], Action.NONE),
        (Category.USER_CANCEL, [], Action.NONE),
        (Category.UNKNOWN, [], Action.RESTART),
    ],
)
def test_design_action_map(category: Category, culprits: list[str], action: Action) -> None:
    assert plan(category, culprits).action is action


def test_isolate_plan_drains_fences_unreachable_and_excludes() -> None:
    p = plan(Category.GPU_HARDWARE, ["n2"])
    assert (p.drain_nodes, p.fence_nodes, p.exclude_nodes) == (["n2"], ["n2"], ["n2"])
    assert p.expected_restart_count == 2 and p.mode is Mode.MONITOR


def test_application_error_never_drains_even_if_a_verdict_names_a_node() -> None:
    p = plan(Category.APPLICATION, ["n2"])
    assert p.action is Action.HOLD and p.drain_nodes == [] and p.exclude_nodes == []


def test_unknown_twice_holds() -> None:
    assert plan(Category.UNKNOWN, [], previous_unknown=True).action is Action.HOLD


def test_budget_exhausted_holds_with_a_refused_guard() -> None:
    p = plan(Category.GPU_HARDWARE, ["n2"], Policy(restart_budget=3), restarts_in_window=3)
    assert p.action is Action.HOLD and not p.drain_nodes
    assert [(g.guard, g.allowed) for g in p.guards] == [("restart_budget", False)]


def test_blast_radius_counts_earlier_drains_in_the_window() -> None:
    # 10% of 40 nodes = 4 per window; three already drained + one new fits, two new do not.
    ok = plan(Category.NETWORK, ["n2"], drained_in_window=["a", "b", "c"])
    assert ok.action is Action.ISOLATE_AND_RESTART
    refused = plan(Category.NETWORK, ["n1", "n2"], drained_in_window=["a", "b", "c"])
    assert refused.action is Action.HOLD and not refused.drain_nodes
    assert ("blast_radius", False) in [(g.guard, g.allowed) for g in refused.guards]


def test_drain_limit_rounds_up_and_respects_the_cap() -> None:
    assert drain_limit(Policy(), 4) == 1
    assert drain_limit(Policy(drain_cap=2), 1000) == 2
    assert drain_limit(Policy(), 0) == 0


def test_node_already_drained_is_not_counted_again() -> None:
    p = plan(Category.GPU_HARDWARE, ["n2"], already_drained=["n2"], drained_in_window=["x"] * 4)
    assert p.action is Action.ISOLATE_AND_RESTART and p.drain_nodes == []
    assert p.exclude_nodes == ["n2"]


def test_mode_overrides_category_then_partition() -> None:
    policy = Policy(
        partition_modes={"gpu": Mode.AUTONOMOUS}, category_modes={Category.NETWORK: Mode.MONITOR}
    )
    assert plan(Category.GPU_HARDWARE, ["n2"], policy).mode is Mode.AUTONOMOUS
    assert plan(Category.NETWORK, ["n2"], policy).mode is Mode.MONITOR


def test_job_comment_can_lower_the_budget_but_not_raise_it() -> None:
    low = EVIDENCE.model_copy(update={"job": EVIDENCE.job.model_copy(update={"max_restarts": 1})})
    high = EVIDENCE.model_copy(update={"job": EVIDENCE.job.model_copy(update={"max_restarts": 9})})
    verdict = Verdict(category=Category.NETWORK, culprit_nodes=["n2"], action=Action.NONE)
    history = PlanHistory(partition_size=40, restarts_in_window=1)
    assert (
        make_plan(
            request_id="r", verdict=verdict, evidence=low, policy=Policy(), history=history
        ).action
        is Action.HOLD
    )
    three = PlanHistory(partition_size=40, restarts_in_window=3)
    assert (
        make_plan(
            request_id="r", verdict=verdict, evidence=high, policy=Policy(), history=three
        ).action
        is Action.HOLD
    )
