"""From a verdict to an action plan, under policy: the design's category → action map, the
trust model (only a culprit a trusted source corroborates is drained; one named by the job's
output alone is excluded from this job's restart and marked suspect; one the jobs of enough
different users named is sent to its lifecycle's checks, never drained on that alone), the
restart budget, and the blast-radius guard. Pure: the caller supplies the history."""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from datetime import datetime

from pydantic import BaseModel, Field

from relaunch.detection.health_events import untrusted_health_nodes
from relaunch.models.recovery import (
    RELAUNCH_REASONS,
    RESTARTING,
    Action,
    ActionPlan,
    Category,
    EvidenceSummary,
    GuardDecision,
    Policy,
    RestartMethod,
    Verdict,
)
from relaunch.models.scheduler import Node

DEFAULT_ACTIONS: dict[Category, Action] = {
    Category.GPU_HARDWARE: Action.ISOLATE_AND_RESTART,
    Category.NETWORK: Action.ISOLATE_AND_RESTART,
    Category.NODE_FAILURE: Action.ISOLATE_AND_RESTART,
    # Exclude instead, where a culprit is not corroborated; restart only, where none is known.
    Category.HANG: Action.ISOLATE_AND_RESTART,
    Category.INFRASTRUCTURE: Action.RESTART,
    Category.APPLICATION: Action.HOLD,
    Category.PREEMPTION: Action.NONE,
    Category.TIME_LIMIT: Action.NONE,
    Category.USER_CANCEL: Action.NONE,
    Category.UNKNOWN: Action.RESTART,  # once; then hold
}


def default_action(
    category: Category, culprits: Sequence[str], corroboration: Mapping[str, Sequence[str]]
) -> Action:
    """The design's map from category to action: a node-level failure isolates its culprits
    when a trusted source corroborates one of them (only those are drained: `make_plan`; the
    others are excluded), else excludes them all from this job's restart (draining nothing);
    with no culprit it restarts. Job-written noise naming more nodes never keeps a node that a
    trusted source convicts in service."""
    action = DEFAULT_ACTIONS[category]
    if action is Action.ISOLATE_AND_RESTART and not culprits:
        return Action.RESTART
    if action is Action.ISOLATE_AND_RESTART and not any(corroboration.get(n) for n in culprits):
        return Action.EXCLUDE_AND_RESTART
    return action


class PlanHistory(BaseModel):
    """What the planner needs to know about the past (read from the audit trail and a fresh
    read of the scheduler's nodes)."""

    restarts_in_window: int = 0
    drained_in_window: list[str] = Field(
        default_factory=list,
        description="nodes Relaunch drained in the guard's window that are still out of service",
    )
    partition_size: int = 0
    previous_unknown: bool = False
    already_drained: list[str] = Field(
        default_factory=list, description="the job's nodes already drained (by anyone)"
    )
    suspected_by: dict[str, list[str]] = Field(
        default_factory=dict,
        description="node → the users whose jobs named it by job-controlled evidence alone in "
        "the suspicion window (this job's user included)",
    )


def drain_limit(policy: Policy, partition_size: int) -> int:
    """How many nodes Relaunch may drain in one window: a share of the partition (rounded up,
    so a small partition can still lose one node) and never more than the hard cap."""
    return min(policy.drain_cap, math.ceil(policy.drain_share * max(partition_size, 0)))


def held_out(
    nodes: Sequence[Node], drained_by_relaunch: Collection[str], since: datetime
) -> set[str]:
    """The nodes Relaunch took out of service in the window and that are still out (drained or
    down in a fresh read): drained according to its audit trail, or carrying its drain reason
    where a crash lost the audit row. An operator's resume gives the node back."""
    down = {n.name for n in nodes if n.drain_flag or not n.responding}
    by_reason = {
        n.name
        for n in nodes
        if n.drain_flag
        and n.reason.startswith(RELAUNCH_REASONS)
        and (n.reason_time is None or n.reason_time >= since)
    }
    return (set(drained_by_relaunch) | by_reason) & down


def partition_size(nodes: Sequence[Node], partition: str) -> int:
    """The nodes of ``partition`` (the whole cluster when none is in it or it is unknown)."""
    return sum(1 for n in nodes if partition in n.partitions) or len(nodes)


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
    """The plan for one verdict. Only culprits a trusted source corroborates are drained; the
    others are excluded from this job's restart and listed as suspects, and those the jobs of
    ``policy.suspect_users`` different users named are sent to their lifecycle's checks. A
    blast-radius refusal keeps the plan but marks it as needing an operator's override; an
    exhausted budget holds."""
    job = evidence.job
    mode = policy.mode_for(job.partition, verdict.category)
    # An application error never blames a node, whatever the verdict's culprits say.
    culprits = [] if verdict.category is Category.APPLICATION else list(verdict.culprit_nodes)
    corroboration = {n: list(verdict.corroboration.get(n, [])) for n in culprits}
    action = default_action(verdict.category, culprits, corroboration)
    reasons = [f"{verdict.category.value} → {action.value} (the default for this verdict)"]
    # Still running and advancing, and no trusted fault (attribution): recorded, not acted on.
    still = verdict.still_running and not any(corroboration[n] for n in culprits)
    if still:
        action = Action.NONE
        reasons.append(
            "the job still runs and its ranks advance, and no trusted source names a fault: "
            "no action (recorded; a later fault of this attempt opens a new recovery)"
        )
    guards: list[GuardDecision] = []
    suspects = [n for n in culprits if not corroboration[n]]
    told = untrusted_health_nodes(verdict)
    excluding = action in {Action.ISOLATE_AND_RESTART, Action.EXCLUDE_AND_RESTART}
    checks = [
        n for n in suspects if len(set(history.suspected_by.get(n, []))) >= policy.suspect_users
    ]
    if checks and excluding:
        reasons.append(
            f"{', '.join(checks)} named by the jobs of {policy.suspect_users}+ different users "
            f"in {policy.suspect_window_hours:g} h: sent to its lifecycle's checks, not drained "
            "(job output points, never convicts)"
        )
    if (by_job := [n for n in suspects if n not in told]) and excluding:
        reasons.append(
            f"{', '.join(by_job)} named only by the job's output (no trusted source confirms "
            "it): excluded from this job's restart, suspect, not drained"
        )
    if (by_sender := [n for n in suspects if n in told]) and excluding:
        reasons.append(
            f"{', '.join(by_sender)} named only by a health event of a sender not trusted with "
            "them (no trusted source confirms it): excluded from this job's restart, not drained"
        )

    if verdict.category is Category.UNKNOWN and history.previous_unknown and not still:
        action = Action.HOLD
        reasons.append("unknown cause for the second time: hold for a human")

    offenders = [n for n in verdict.repeat_offenders if n in culprits and corroboration[n]]
    if offenders and action in {Action.RESTART, Action.HOLD}:
        action = Action.ISOLATE_AND_RESTART
        reasons.append(
            f"repeat offender(s) {', '.join(offenders)}: drain and check the hardware, "
            "though this incident alone names no node"
        )

    # Slurm lists the job CANCELLED (its user's scancel, an error trap's): a trusted fault on
    # one of its nodes is still drained, but the job is not brought back against that cancel.
    cancelled = job.state.upper().startswith("CANCELLED") and action in RESTARTING
    if cancelled and action is not Action.ISOLATE_AND_RESTART:
        action = Action.NONE
        reasons.append("job cancelled (Slurm lists it CANCELLED): not restarted")
    elif cancelled:
        reasons.append(
            "job cancelled (Slurm lists it CANCELLED): the convicted nodes are drained, the job "
            "is not restarted"
        )

    if action in RESTARTING and not cancelled:
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
    needs_override = False
    if action is Action.ISOLATE_AND_RESTART:
        # Never a node on the job's word alone, whatever produced the action.
        convicted = [n for n in culprits if corroboration[n]]
        drain = [n for n in convicted if n not in history.already_drained]
        guard = blast_radius(policy, history.partition_size, history.drained_in_window, drain)
        guards.append(guard)
        if not guard.allowed:
            needs_override = True
            reasons.append(
                "blast-radius guard refused the drain: it runs only on an operator's override"
            )

    remedies = {n: verdict.remedies[n] for n in drain if n in verdict.remedies}
    if remedies:
        rungs = ", ".join(f"{n} {rung}" for n, rung in sorted(remedies.items()))
        reasons.append(f"remedy by the Xid catalogue: {rungs}")
    excluding = action in {Action.ISOLATE_AND_RESTART, Action.EXCLUDE_AND_RESTART}
    fence = [n for n in drain if n in evidence.unreachable_nodes]
    exclude = sorted({*culprits, *history.already_drained} & set(job.nodes)) if excluding else []
    restart_method = policy.restart_method
    if excluding and job.spare_left(exclude):
        restart_method = RestartMethod.SPARE
        reasons.append(
            f"job {job.job_id} trains on {job.train_nodes} of its {len(job.nodes)} nodes: "
            f"{','.join(exclude)} leave(s) it and it trains again on a spare"
        )
    return ActionPlan(
        request_id=request_id,
        action=action,
        mode=mode,
        drain_nodes=drain,
        fence_nodes=fence,
        restart_method=restart_method,
        job_id=job.job_id,
        expected_restart_count=job.restart_count,
        exclude_nodes=exclude,
        suspect_nodes=sorted(suspects) if excluding else [],
        check_nodes=sorted(checks) if excluding else [],
        needs_override=needs_override,
        guards=guards,
        reasons=reasons,
        remedies=remedies,
        category=verdict.category,
        job_cancelled=cancelled and action is Action.ISOLATE_AND_RESTART,
    )


def node_decision_nodes(verdict: Verdict, evidence: EvidenceSummary, policy: Policy) -> list[str]:
    """The culprits whose node decisions this job's recovery joins instead of planning its
    own drain (see relaunch/models/node_decision.py): a node-level failure whose every culprit
    a trusted source corroborates, restarted by requeue (the decision requeues its jobs in
    batches). Anything else (an application error, a culprit named only by the job's output or
    by other users' suspicion, no culprit, restart by resubmission) is planned job by job."""
    if not policy.node_decisions or policy.restart_method is not RestartMethod.REQUEUE:
        return []
    culprits = sorted(set(verdict.culprit_nodes))
    action = default_action(verdict.category, culprits, verdict.corroboration)
    if action is not Action.ISOLATE_AND_RESTART or verdict.still_running:
        return []
    if not all(verdict.corroboration.get(n) for n in culprits):  # a suspect among them
        return []
    if not set(culprits) <= set(evidence.job.nodes):  # a culprit the job did not run on
        return []
    if evidence.job.state.upper().startswith("CANCELLED"):  # drained, never requeued
        return []
    if evidence.job.spare_left(culprits):  # it trains on a spare: its own plan, no requeue
        return []
    return culprits
