"""Committed workflow histories replay against today's RecoveryWorkflow,
NodeDecisionWorkflow and NodeLifecycleWorkflow. A change to a workflow's command sequence
that is not behind `workflow.patched(...)` fails here (docs/versioning.md).

The histories are the v1 baseline, each recorded by the test named beside it; re-record with
`RELAUNCH_RECORD_HISTORIES=1` and that test (the tests/integration ones under the stack lock)
after an intended, versioned change."""

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

# Every committed history, by the test that records it.
EXPECTED = {
    # tests/integration/test_recovery.py and test_guard_race.py, on the real stack: job
    # recoveries that joined their node's decision (autonomous, approved with the Temporal CLI)
    # with those decisions, an expiry, an application error held, a plan the guard refused
    # (held in autonomous mode, overridden by an operator in monitor mode) and a drain refused
    # at drain time.
    "autonomous_node_failure_joined",
    "node_decision_autonomous",
    "monitor_approved_joined",
    "node_decision_monitor_approved",
    "monitor_expired",
    "application_held",
    "autonomous_guard_held",
    "monitor_override_approved",
    "monitor_refused_at_drain",
    # tests/integration/test_spares.py: a job that trained again on its spare (the node out of
    # the running job, its step ended) and an application error its launcher restarted in the
    # job (recorded, no action).
    "spare_restart",
    "in_job_restart",
    # tests/unit/test_node_decision.py: recoveries that joined a decision (autonomous, monitor),
    # a decision that requeued 24 jobs in batches, one held by its guard, one started by the
    # watcher's report, one that requeued the reported jobs ahead of their joins, and second
    # looks (a report after the drain; a node whose slurmd died after plan_node's probe).
    "node_decision_joined_autonomous",
    "node_decision_joined_monitor",
    "node_decision_requeued",
    "node_decision_guard_held",
    "node_decision_reported",
    "node_decision_requeued_ahead",
    "node_decision_late_report",
    "node_decision_looked_again",
    # tests/unit/test_lifecycle_workflow.py and test_lifecycle_guard.py: rebooted and returned
    # on its own, approved step by step in monitor mode, a rejected reboot sent to repair and
    # back, and inconclusive checks sent to a person.
    "lifecycle_returned_autonomous",
    "lifecycle_monitor_approved",
    "lifecycle_rejected_repaired",
    "lifecycle_inconclusive",
    "lifecycle_suspect_cleared",
}


def test_histories_are_committed() -> None:
    """Exactly the baseline's histories: none missing, and none left from a retired version."""
    assert {p.stem for p in HISTORIES} == EXPECTED


@pytest.mark.parametrize("path", HISTORIES, ids=[p.stem for p in HISTORIES])
async def test_replay(path: Path) -> None:
    replayer = Replayer(
        workflows=[RecoveryWorkflow, NodeDecisionWorkflow, NodeLifecycleWorkflow],
        workflow_runner=WORKFLOW_RUNNER,  # the workers' own
        data_converter=pydantic_data_converter,
    )
    await replayer.replay_workflow(WorkflowHistory.from_json(path.stem, path.read_text()))
