"""The planner: the design's category → action map, the trust model (drain only what a trusted
source or several users' jobs corroborate; exclude what the job's output alone names), budget,
blast radius counted in nodes, never blaming a node for an application error."""

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
    category: Category,
    culprits: list[str],
    policy: Policy | None = None,
    *,
    trusted: bool = True,
    **history: object,
) -> ActionPlan:
    """A plan for a verdict whose culprits a kernel log confirms (``trusted``) or that only
    the job's output names."""
    verdict = Verdict(
        category=category,
        culprit_nodes=culprits,
        confidence=0.9,
        action=Action.NONE,
        corroboration={n: ["kernel_log"] if trusted else [] for n in culprits},
    )
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


@pytest.mark.parametrize(
    "category", [Category.GPU_HARDWARE, Category.NETWORK, Category.NODE_FAILURE, Category.HANG]
)
def test_a_culprit_named_only_by_the_jobs_output_is_excluded_never_drained(
    category: Category,
) -> None:
    p = plan(category, ["n2"], trusted=False, already_drained=["n1"])
    assert p.action is Action.EXCLUDE_AND_RESTART
    assert (p.drain_nodes, p.fence_nodes) == ([], [])
    assert p.exclude_nodes == ["n1", "n2"]  # the suspect, and what is already out of service
    assert p.suspect_nodes == ["n2"] and not p.needs_override
    assert any("named only by the job's output" in r for r in p.reasons)
    assert [g.guard for g in p.guards] == ["restart_budget"]  # nothing to drain, no blast radius


def test_a_culprit_without_corroboration_is_never_drained_whatever_its_action_says() -> None:
    verdict = Verdict(
        category=Category.GPU_HARDWARE,
        culprit_nodes=["n1", "n2"],
        action=Action.ISOLATE_AND_RESTART,
        corroboration={"n1": ["telemetry"]},  # n2 missing: not corroborated
    )
    history = PlanHistory(partition_size=40)
    p = make_plan(
        request_id="r", verdict=verdict, evidence=EVIDENCE, policy=Policy(), history=history
    )
    # n1 is convicted and drained; the job's noise about n2 neither drains n2 nor keeps n1 in.
    assert p.action is Action.ISOLATE_AND_RESTART and p.drain_nodes == ["n1"]
    assert p.suspect_nodes == ["n2"] and p.exclude_nodes == ["n1", "n2"]
    assert any("n2 named only by the job's output" in r for r in p.reasons)


def test_suspicion_from_jobs_of_different_users_sends_the_node_to_its_checks() -> None:
    """Job output points, never convicts, however many users' jobs print it: the node is
    checked (its lifecycle), not drained."""
    two_users = plan(Category.NETWORK, ["n2"], trusted=False, suspected_by={"n2": ["ana", "bo"]})
    assert two_users.action is Action.EXCLUDE_AND_RESTART and two_users.drain_nodes == []
    assert two_users.suspect_nodes == ["n2"] and two_users.check_nodes == ["n2"]
    assert two_users.exclude_nodes == ["n2"]
    assert any("different users" in r and "checks, not drained" in r for r in two_users.reasons)
    # One user's many jobs are one voice; a stricter policy needs a third user.
    one_user = plan(Category.NETWORK, ["n2"], trusted=False, suspected_by={"n2": ["ana", "ana"]})
    assert one_user.action is Action.EXCLUDE_AND_RESTART and one_user.check_nodes == []
    strict = plan(
        Category.NETWORK,
        ["n2"],
        Policy(suspect_users=3),
        trusted=False,
        suspected_by={"n2": ["ana", "bo"]},
    )
    assert strict.suspect_nodes == ["n2"] and strict.check_nodes == []
    other_node = plan(Category.NETWORK, ["n2"], trusted=False, suspected_by={"n1": ["ana", "bo"]})
    assert other_node.action is Action.EXCLUDE_AND_RESTART and other_node.check_nodes == []
    # A node a trusted source convicts is drained, not merely checked.
    convicted = plan(Category.NETWORK, ["n2"], suspected_by={"n2": ["ana", "bo"]})
    assert convicted.drain_nodes == ["n2"] and convicted.check_nodes == []


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
    # 10% of 40 nodes = 4 per window; three already out + one new fits, two new do not.
    ok = plan(Category.NETWORK, ["n2"], drained_in_window=["a", "b", "c"])
    assert ok.action is Action.ISOLATE_AND_RESTART and not ok.needs_override
    refused = plan(Category.NETWORK, ["n1", "n2"], drained_in_window=["a", "b", "c"])
    # The plan stands for an operator to override; it does not run on its own.
    assert refused.action is Action.ISOLATE_AND_RESTART and refused.needs_override
    assert refused.drain_nodes == ["n1", "n2"]
    assert ("blast_radius", False) in [(g.guard, g.allowed) for g in refused.guards]
    assert any("override" in r for r in refused.reasons)


def test_a_node_drained_earlier_and_failing_again_counts_once() -> None:
    """Seen on a 4-node cluster (limit 1): a node Relaunch had drained came back, crashed, and
    the guard counted it twice and refused, leaving the job on a dead node."""
    p = plan(Category.NODE_FAILURE, ["n2"], partition_size=4, drained_in_window=["n2"])
    assert p.action is Action.ISOLATE_AND_RESTART and p.drain_nodes == ["n2"]
    assert not p.needs_override
    assert [(g.guard, g.allowed) for g in p.guards][-1] == ("blast_radius", True)
    other = plan(Category.NODE_FAILURE, ["n1"], partition_size=4, drained_in_window=["n2"])
    assert other.needs_override  # a second node is over the limit


def test_exhausted_budget_holds_an_exclusion_too() -> None:
    p = plan(Category.NETWORK, ["n2"], trusted=False, restarts_in_window=3)
    assert p.action is Action.HOLD and p.exclude_nodes == [] and p.drain_nodes == []


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


def test_a_repeat_offender_is_drained_on_its_trusted_record() -> None:
    verdict = Verdict(
        category=Category.UNKNOWN,
        culprit_nodes=["n2"],
        action=Action.ISOLATE_AND_RESTART,
        repeat_offenders=["n2"],
        corroboration={"n2": ["reputation"]},
    )
    history = PlanHistory(partition_size=40)
    p = make_plan(
        request_id="r", verdict=verdict, evidence=EVIDENCE, policy=Policy(), history=history
    )
    assert p.action is Action.ISOLATE_AND_RESTART and p.drain_nodes == ["n2"]
    assert any("repeat offender" in r for r in p.reasons)
    bare = verdict.model_copy(update={"corroboration": {"n2": []}})
    q = make_plan(request_id="r", verdict=bare, evidence=EVIDENCE, policy=Policy(), history=history)
    assert q.action is not Action.ISOLATE_AND_RESTART and q.drain_nodes == []


def test_a_drained_node_carries_the_rung_its_xids_ask_for() -> None:
    verdict = Verdict(
        category=Category.GPU_HARDWARE,
        culprit_nodes=["n2"],
        confidence=0.95,
        action=Action.NONE,
        corroboration={"n2": ["kernel_log"]},
        remedies={"n2": "reboot"},
    )
    p = make_plan(
        request_id="r",
        verdict=verdict,
        evidence=EVIDENCE,
        policy=Policy(),
        history=PlanHistory(partition_size=40),
    )
    assert p.drain_nodes == ["n2"] and p.remedies == {"n2": "reboot"}
    assert "remedy by the Xid catalogue: n2 reboot" in p.reasons
    # A node already drained by someone else is not drained again, and carries no rung here.
    again = make_plan(
        request_id="r",
        verdict=verdict,
        evidence=EVIDENCE,
        policy=Policy(),
        history=PlanHistory(partition_size=40, already_drained=["n2"]),
    )
    assert again.drain_nodes == [] and again.remedies == {}
