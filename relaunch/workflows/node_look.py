"""How a node decision looks at its drained node again (relaunch/workflows/node_decision.py).

A decision that holds the watcher's report but did not requeue its jobs ahead (the report
came after the drain, or the node's slurmd still answered plan_node's probe: a node's Xid
line is often written before it dies) looks at the drained node again (`look_again`). Once
the slurmd is silent, the node is fenced and the report's jobs that have not joined are
requeued ahead.
"""

from __future__ import annotations

import contextlib
from datetime import datetime, timedelta

from temporalio import workflow
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    from relaunch.activities.node import NodeActivities
    from relaunch.models.node_decision import (
        Ahead,
        JobOutcome,
        JoinRequest,
        LookAgainInput,
        NodeDecisionInput,
        NodePlan,
        NodeReport,
    )
    from relaunch.workflows.calls import REQUEUE, call

# When to look, after the drain; a report that comes later is looked at once.
LOOKS = tuple(timedelta(seconds=s) for s in (1, 3, 6, 10, 20))


class LookAgain:
    """The node decision's looks again; its state is the decision's (see its __init__)."""

    _id: str
    _input: NodeDecisionInput | None
    _plan: NodePlan | None
    _report: NodeReport | None
    _report_used: bool
    _isolated_at: datetime | None
    _looks: int
    _looked: bool
    _final: tuple[JobOutcome, str] | None
    _pending: list[JoinRequest]
    _joined: dict[str, JoinRequest]
    _ahead: dict[str, Ahead]
    _back: str

    def _look_due_at(self) -> datetime | None:
        """When to look at the node again, or None: a decision that drained the
        node on its own (autonomous), holds the watcher's report of its jobs, and has not
        requeued them ahead, because the report came after the drain or the node still
        answered plan_node's probe (then it was drained, not fenced)."""
        plan, report, at = self._plan, self._report, self._isolated_at
        if self._looked or report is None or not report.running:
            return None
        if plan is None or plan.isolated is None or not plan.isolated.ok or at is None:
            return None
        if self._final is not None or self._looks >= len(LOOKS):
            return None
        if self._report_used and not (plan.drain and not plan.fence):
            return None  # plan_node requeued ahead (or the node was out before: not ours)
        return at + LOOKS[self._looks]

    def _look_due(self) -> bool:
        due = self._look_due_at()
        return due is not None and workflow.now() >= due

    async def _until_joined_or_look(self) -> None:
        """Wait for a join, a late report, or the next look, whichever comes first."""
        due = self._look_due_at()
        assert due is not None
        wait = due - workflow.now()
        if wait <= timedelta(0):
            return
        with contextlib.suppress(TimeoutError):
            await workflow.wait_condition(
                lambda: bool(self._pending) or self._look_due() or bool(self._back),
                timeout=wait,
                timeout_summary="look at the node again",
            )

    async def _look_again(self) -> None:
        """One look (`look_again`): once the node's slurmd is silent, it is fenced and the
        report's jobs that have not joined are requeued ahead (their batches requeue the
        others); a job that joins meanwhile is matched when the look is done."""
        inp, report, plan = self._input, self._report, self._plan
        assert inp is not None and report is not None and plan is not None
        self._report_used = True  # a report that came late is looked at once, then as planned
        self._looks += 1
        joined = {r.job_id for r in self._joined.values()}
        try:
            looked = await call(
                NodeActivities.look_again,
                LookAgainInput(
                    decision_id=self._id,
                    cluster=inp.cluster,
                    node=inp.node,
                    report=report,
                    plan=plan,
                    policy=inp.policy,
                    joined=[j.job_id for j in report.running if j.job_id in joined],
                    last=self._looks >= len(LOOKS),
                ),
                REQUEUE,
                f"look at {inp.node} again ({self._looks} of {len(LOOKS)})",
            )
        except ActivityError as err:  # their joins requeue them, as without the report
            workflow.logger.warning("look at %s again: %s", inp.node, err)
            self._looked = True
            return
        if looked.looked != "answers":
            self._looked = True
        self._ahead.update({a.job_id: a for a in looked.ahead})
