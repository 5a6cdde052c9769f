"""Committed workflow histories replay against today's RecoveryWorkflow,
NodeDecisionWorkflow and NodeLifecycleWorkflow. A change to the
workflow's command sequence that is not behind `workflow.patched(...)` fails here.

Re-record with `RELAUNCH_RECORD_HISTORIES=1 make test` after an intended, versioned change."""

from __future__ import annotations

from pathlib import Path

import pytest
from temporalio.client import WorkflowHistory
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer

from relaunch.workers.worker import WORKFLOW_RUNNER
from relaunch.workflows.lifecycle import NodeLifecycleWorkflow
from relaunch.workflows.node_decision import NodeDecisionWorkflow
from relaunch.workflows.recovery import RecoveryWorkflow

HISTORIES = sorted((Path(__file__).resolve().parents[1] / "histories").glob("*.json"))


def test_histories_are_committed() -> None:
    names = {p.stem for p in HISTORIES}
    recorded = {"autonomous_node_failure", "monitor_approved", "application_held"}
    assert recorded <= names
    # Recorded before the quick steps became local activities: they still replay, unpatched.
    assert {f"{name}.before-local-steps" for name in recorded} <= names
    # Recorded with the guard-refusals patch: a plan the guard refused, held in autonomous
    # mode or overridden by an operator in monitor mode, and a drain refused at drain time.
    guarded = {"autonomous_guard_held", "monitor_override_approved", "monitor_refused_at_drain"}
    assert guarded <= names
    # Recorded with node decisions (tests/unit/test_node_decision.py): job recoveries that
    # joined one (autonomous, and approved through a job in monitor mode), a decision that
    # requeued 24 jobs in batches, and one held by its guard.
    joined = {"node_decision_joined_autonomous", "node_decision_joined_monitor"}
    assert {*joined, "node_decision_requeued", "node_decision_guard_held"} <= names
    assert "node_decision_reported" in names  # started by the watcher's report
    # Recorded before plan_node isolated the node in the same step (patch node-plan-isolates).
    assert {"node_decision_requeued", "node_decision_reported"} <= names
    assert {
        "node_decision_requeued.before-plan-isolates",
        "node_decision_reported.before-plan-isolates",
    } <= names
    # A decision that requeued its reported jobs ahead of their joins (patch node-requeue-ahead),
    # and one started by a report before that patch.
    assert {"node_decision_requeued_ahead", "node_decision_reported.before-requeue-ahead"} <= names
    # Second looks (patch node-look-again): a decision whose report came after it had isolated
    # the node, and one whose node's slurmd died after plan_node's probe.
    assert {"node_decision_late_report", "node_decision_looked_again"} <= names
    # Node lifecycles (tests/unit/test_lifecycle_workflow.py): rebooted and returned on its
    # own, approved step by step in monitor mode, and a rejected reboot sent to repair and back.
    lifecycles = {"lifecycle_returned_autonomous", "lifecycle_monitor_approved"}
    assert {*lifecycles, "lifecycle_rejected_repaired"} <= names


@pytest.mark.parametrize("path", HISTORIES, ids=[p.stem for p in HISTORIES])
async def test_replay(path: Path) -> None:
    replayer = Replayer(
        workflows=[RecoveryWorkflow, NodeDecisionWorkflow, NodeLifecycleWorkflow],
        workflow_runner=WORKFLOW_RUNNER,  # the workers' own
        data_converter=pydantic_data_converter,
    )
    await replayer.replay_workflow(WorkflowHistory.from_json(path.stem, path.read_text()))
