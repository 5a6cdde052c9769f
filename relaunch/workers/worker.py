"""The Temporal worker for one cluster: RecoveryWorkflow plus its activities.

Clients and pools are built once and injected; SIGTERM/SIGINT shut it down gracefully (running
activities finish, the workflow resumes elsewhere from history)."""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from temporalio.client import Client
from temporalio.worker import Worker
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner, SandboxRestrictions

from relaunch.activities.actions import ActionActivities
from relaunch.activities.deps import Deps
from relaunch.activities.evidence import EvidenceActivities
from relaunch.activities.lifecycle import LifecycleActivities
from relaunch.activities.node import NodeActivities
from relaunch.connectors.audit import AuditStore
from relaunch.connectors.logstores import open_log_store
from relaunch.connectors.slurm.factory import close_scheduler, slurm_scheduler
from relaunch.connectors.temporal import connect
from relaunch.connectors.tracing import start_tracing
from relaunch.detection.signatures import Catalogue
from relaunch.models.config import ClusterConfig
from relaunch.models.node_decision import node_task_queue
from relaunch.models.recovery import task_queue
from relaunch.workflows.lifecycle import NodeLifecycleWorkflow
from relaunch.workflows.node_decision import NodeDecisionWorkflow
from relaunch.workflows.recovery import RecoveryWorkflow

log = logging.getLogger("relaunch.worker")

WORKFLOWS = [RecoveryWorkflow, NodeDecisionWorkflow, NodeLifecycleWorkflow]

# The sandbox imports a workflow's module afresh for every workflow it starts: for Relaunch's,
# compiling relaunch/workflows/recovery.py and node_decision.py anew each time (a py-spy
# profile of a 500-job burst: 12 % of the worker's CPU, most of it compiling source). Relaunch's
# own modules are passed through instead: imported once per process. They keep no mutable
# global state a workflow could see, and every workflow change is still checked by replaying
# the committed histories (tests/unit/test_replay.py) against this same runner. OpenTelemetry
# is passed through for the tracing interceptor's workflow side (docs/tracing.md): a workflow's
# spans must see the process's one context and provider, not a copy the sandbox imported.
WORKFLOW_RUNNER = SandboxedWorkflowRunner(
    restrictions=SandboxRestrictions.default.with_passthrough_modules("relaunch", "opentelemetry")
)


def activities_for(deps: Deps) -> list[Callable[..., Any]]:
    evidence, actions, node = EvidenceActivities(deps), ActionActivities(deps), NodeActivities(deps)
    life = LifecycleActivities(deps)
    return [
        evidence.record_detection,
        evidence.record_event,
        evidence.gather_evidence,
        evidence.attribute,
        evidence.plan,
        actions.isolate,
        actions.restart,
        actions.hold,
        actions.verify,
        actions.verify_check,
        node.investigate,
        node.join_node_decisions,
        node.plan_node,
        node.requeue_batch,
        node.look_again,
        life.start,
        life.reserve,
        life.hold,
        life.run_checks,
        life.apply_rung,
        life.escalate,
        life.return_node,
        life.node_state,
    ]


def build_workers(client: Client, deps: Deps) -> list[Worker]:
    """The cluster's two pollers in one process: job recoveries on the cluster's task queue,
    node decisions (and their activities) on its node queue, so that a decision never waits
    behind the recoveries it decides for. The activities are the same on both; each queue has
    slots of its own."""
    activities = activities_for(deps)
    return [
        Worker(
            client,
            task_queue=queue,
            workflows=WORKFLOWS,
            workflow_runner=WORKFLOW_RUNNER,
            activities=activities,
            graceful_shutdown_timeout=timedelta(seconds=20),
        )
        for queue in (task_queue(deps.config.name), node_task_queue(deps.config.name))
    ]


async def run_worker(config: ClusterConfig) -> None:
    log_store = open_log_store(config.logs)  # first: a missing secret fails before connecting
    scheduler = slurm_scheduler(config)  # reads the slurmrestd JWT key, if any, now
    # Compile the signature catalogue now (about 2 s with hyperscan), not in the first recovery.
    await asyncio.to_thread(Catalogue.load)
    tracing = start_tracing(config, "worker")  # a missing headers variable fails here too
    client = await connect(config, tracing.interceptors)
    audit = await AuditStore.open(config.database_url)
    deps = Deps(
        config=config, scheduler=scheduler, audit=audit, log_store=log_store, temporal=client
    )
    workers = build_workers(client, deps)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    log.info(
        "worker for cluster %s on task queues %s and %s",
        config.name,
        task_queue(config.name),
        node_task_queue(config.name),
    )
    try:
        async with workers[0], workers[1]:
            await stop.wait()
            log.info("shutting down")
    finally:
        await deps.close()
        await audit.close()
        await close_scheduler(scheduler)
        if log_store is not None:
            await log_store.aclose()
        tracing.shutdown()  # last: the spans of the activities that just finished
