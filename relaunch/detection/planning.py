"""From a verdict to an action plan, under policy: the design's category → action map, the
restart budget, and the blast-radius guard. Pure: the caller supplies the history."""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence

from pydantic import BaseModel, Field

from relaunch.models.recovery import (
    Action,
    ActionPlan,
    Category,
    EvidenceSummary,
    GuardDecision,
    Policy,
    Verdict,
)

DEFAULT_ACTIONS: dict[Category, Action] = {
    Category.GPU_HARDWARE: Action.ISOLATE_AND_RESTART,
    Category.NETWORK: Action.ISOLATE_AND_RESTART,
    Category.NODE_FAILURE: Action.ISOLATE_AND_RESTART,
    Category.HANG: Action.ISOLATE_AND_RESTART,  # restart only, when no culprit is known
    Category.INFRASTRUCTURE: Action.RESTART,
    Category.APPLICATION: Action.HOLD,
    Category.PREEMPTION: Action.NONE,
    Category.TIME_LIMIT: Action.NONE,
    Category.USER_CANCEL: Action.NONE,
    Category.UNKNOWN: Action.RESTART,  # once; then hold
}


def default_action(category: Category, culprits: list[str]) -> Action:
    """The design's map from category to action."""
    action = DEFAULT_ACTIONS[category]
    if action is Action.ISOLATE_AND_RESTART and not culprits:
        return Action.RESTART
    return action


class PlanHistory(BaseModel):
    """What the planner needs to know about the past (read from the audit trail)."""

    restarts_in_window: int = 0
    drained_in_window: list[str] = Field(default_factory=list)
    partition_size: int = 0
    previous_unknown: bool = False
    already_drained: list[str] = Field(default_factory=list)


def drain_limit(policy: Policy, partition_size: int) -> int:
    """How many nodes Relaunch may drain in one window: a share of the partition (rounded up,
    so a small partition can still lose one node) and never more than the hard cap."""
    return min(policy.drain_cap, math.ceil(policy.drain_share * max(partition_size, 0)))


def blast_radius(
    policy: Policy, partition_size: int, out_of_service: Collection[str], new: Sequence[str]
) -> GuardDecision:
    """The blast-radius guard, counting nodes rather than events: the nodes Relaunch took out
    that are still out of service, together with the new ones (a node already out is not new,
    so a drained node failing again never counts twice), against the window's limit."""
    out = set(out_of_service)
    fresh = sorted(set(new) - out)
    limit = drain_limit(policy, partition_size)
    total = len(out | set(fresh))
    return GuardDecision(
        guard="blast_radius",
        allowed=total <= limit,
        detail=f"{len(out)} out of service by Relaunch in {policy.drain_window_hours:g} h + "
        f"{len(fresh)} new, limit {limit} ({policy.drain_share:.0%} of "
        f"{partition_size} nodes, cap {policy.drain_cap})",
    )


def make_plan(
    *,
    request_id: str,
    verdict: Verdict,
    evidence: EvidenceSummary,
    policy: Policy,
    history: PlanHistory,
) -> ActionPlan:
    job = evidence.job
    mode = policy.mode_for(job.partition, verdict.category)
    action = default_action(verdict.category, verdict.culprit_nodes)
    reasons = [f"{verdict.category.value} → {action.value} (design default)"]
    guards: list[GuardDecision] = []

    # An application error never blames a node, whatever the verdict's culprits say.
    culprits = [] if verdict.category is Category.APPLICATION else list(verdict.culprit_nodes)

    if verdict.category is Category.UNKNOWN and history.previous_unknown:
        action = Action.HOLD
        reasons.append("unknown cause for the second time: hold for a human")

    offenders = [n for n in verdict.repeat_offenders if n in culprits]
    if offenders and action in {Action.RESTART, Action.HOLD}:
        action = Action.ISOLATE_AND_RESTART
        reasons.append(
            f"repeat offender(s) {', '.join(offenders)}: drain and check the hardware, "
            "though this incident alone names no node"
        )

    if action in {Action.ISOLATE_AND_RESTART, Action.RESTART}:
        budget = policy.restart_budget
        if job.max_restarts is not None:  # the job may ask for fewer, never for more
            budget = min(budget, job.max_restarts)
        budget_ok = history.restarts_in_window < budget
        guards.append(
            GuardDecision(
                guard="restart_budget",
                allowed=budget_ok,
                detail=f"{history.restarts_in_window} of {budget} restarts used "
                f"in {policy.budget_window_hours:g} h",
            )
        )
        if not budget_ok:
            action = Action.HOLD
            reasons.append("restart budget exhausted: hold")

    drain: list[str] = []
    if action is Action.ISOLATE_AND_RESTART:
        new = [n for n in culprits if n not in history.already_drained]
        limit = drain_limit(policy, history.partition_size)
        used = len(set(history.drained_in_window))
        allowed = used + len(new) <= limit
        guards.append(
            GuardDecision(
                guard="blast_radius",
                allowed=allowed,
                detail=f"{used} drained by Relaunch in {policy.drain_window_hours:g} h + "
                f"{len(new)} new, limit {limit} ({policy.drain_share:.0%} of "
                f"{history.partition_size} nodes, cap {policy.drain_cap})",
            )
        )
        if allowed:
            drain = new
        else:
            action = Action.HOLD
            reasons.append("blast-radius guard refused the drain: hold for a human")

    fence = [n for n in drain if n in evidence.unreachable_nodes]
    return ActionPlan(
        request_id=request_id,
        action=action,
        mode=mode,
        drain_nodes=drain,
        fence_nodes=fence,
        restart_method=policy.restart_method,
        job_id=job.job_id,
        expected_restart_count=job.restart_count,
        exclude_nodes=sorted({*culprits, *history.already_drained} & set(job.nodes))
        if action is Action.ISOLATE_AND_RESTART
        else [],
        guards=guards,
        reasons=reasons,
    )
