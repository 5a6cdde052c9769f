"""The Temporal worker for one cluster: RecoveryWorkflow, NodeDecisionWorkflow and
NodeLifecycleWorkflow with their activities, polling both of the cluster's task queues.

Clients and pools are built once and injected; SIGTERM/SIGINT shut it down gracefully (running
activities finish, the workflow resumes elsewhere from history)."""

from __future__ import annotations

import asyncio
import functools
import logging
import signal
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

from temporalio.client import Client
from temporalio.runtime import PrometheusConfig, Runtime, TelemetryConfig
from temporalio.worker import Interceptor, Worker
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
from relaunch.models.config import ClusterConfig, listen_address
from relaunch.models.node_decision import node_task_queue
from relaunch.models.recovery import task_queue
from relaunch.workers.process_metrics import (
    Health,
    MetricsAddressError,
    WorkerMetrics,
    free_loopback_port,
    read_sdk_metrics,
    serving,
)
from relaunch.workers.supervisor import child_index
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
        evidence.plan,
        actions.isolate,
        actions.check_suspects,
        actions.restart,
        actions.hold,
        actions.verify_check,
        actions.launcher_look,
        node.investigate,
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
        life.release,
    ]


def build_workers(
    client: Client, deps: Deps, interceptors: Sequence[Interceptor] = ()
) -> list[Worker]:
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
            interceptors=interceptors,
        )
        for queue in (task_queue(deps.config.name), node_task_queue(deps.config.name))
    ]


# The SDK's schedule-to-start latencies (how long a task waited for a worker: the alert that
# says the workers are too few) get buckets fine enough for a 95th percentile in seconds.
LATENCIES = ("activity_schedule_to_start_latency", "workflow_task_schedule_to_start_latency")
LATENCY_BUCKETS_S = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)


def sdk_metrics_runtime(cluster: str) -> int:
    """Make the Temporal SDK export its metrics (Prometheus text, every series labelled with
    ``cluster``) on a loopback port of its own, read at each scrape of the worker's /metrics
    (process_metrics.py); that port. Before the first client: clients keep the runtime they
    were made with."""
    port = free_loopback_port()
    telemetry = TelemetryConfig(
        global_tags={"cluster": cluster},
        metrics=PrometheusConfig(
            bind_address=f"127.0.0.1:{port}",
            counters_total_suffix=True,
            durations_as_seconds=True,
            histogram_bucket_overrides=dict.fromkeys(LATENCIES, LATENCY_BUCKETS_S),
        ),
    )
    Runtime.set_default(Runtime(telemetry=telemetry), error_if_already_set=False)
    return port


def polling(
    workers: Sequence[Worker], started: float, grace_s: float = 30.0
) -> Callable[[float], str | None]:
    """The worker's health check: each of its Temporal workers running (given ``grace_s``
    from ``started`` to start), none shut down."""

    def check(now: float) -> str | None:
        stopped = [
            w.task_queue
            for w in workers
            if w.is_shutdown or (not w.is_running and now - started > grace_s)
        ]
        return f"Temporal worker not polling: {', '.join(stopped)}" if stopped else None

    return check


def worker_address(config: ClusterConfig, child: tuple[int, int] | None) -> tuple[str, int] | None:
    """Where this worker serves /metrics: ``metrics.worker_address``; child ``i`` of a
    supervisor's ``N`` at its port + i - 1."""
    address = listen_address(config.metrics.worker_address)
    if address is None or child is None:
        return address
    host, port = address
    if port + child[0] - 1 > 65535:
        raise MetricsAddressError(
            f"worker {child[0]}/{child[1]} would serve metrics on port {port + child[0] - 1}",
            hint="metrics.worker_address: a port that leaves room for every process",
        )
    return host, port + child[0] - 1


async def run_worker(config: ClusterConfig) -> None:
    address = worker_address(config, child_index())  # a supervisor's child: a port of its own
    log_store = open_log_store(config.logs)  # first: a missing secret fails before connecting
    scheduler = slurm_scheduler(config)  # reads the slurmrestd JWT key, if any, now
    sdk_port = sdk_metrics_runtime(config.name) if address is not None else None
    # Compile the signature catalogue now (about 2 s with hyperscan), not in the first recovery.
    await asyncio.to_thread(Catalogue.load)
    tracing = start_tracing(config, "worker")  # a missing headers variable fails here too
    client = await connect(config, tracing.interceptors)
    audit = await AuditStore.open(config.database_url)
    deps = Deps(
        config=config, scheduler=scheduler, audit=audit, log_store=log_store, temporal=client
    )
    metrics = WorkerMetrics(config.name, lambda: audit.write_failures)
    workers = build_workers(client, deps, [metrics.interceptor()])
    health = Health()
    health.checks.append(polling(workers, health.started))
    sdk_text = functools.partial(read_sdk_metrics, sdk_port) if sdk_port else None
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        async with (
            serving(address, metrics.registry, health, extra=sdk_text, what="worker"),
            workers[0],
            workers[1],
        ):
            log.info(
                "worker for cluster %s on task queues %s and %s",
                config.name,
                task_queue(config.name),
                node_task_queue(config.name),
            )
            await stop.wait()
            log.info("shutting down")
    finally:
        await deps.close()
        await audit.close()
        await close_scheduler(scheduler)
        if log_store is not None:
            await log_store.aclose()
        tracing.shutdown()  # last: the spans of the activities that just finished
