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

from relaunch.activities.actions import ActionActivities
from relaunch.activities.deps import Deps
from relaunch.activities.evidence import EvidenceActivities
from relaunch.connectors.audit import AuditStore
from relaunch.connectors.logstores import open_log_store
from relaunch.connectors.slurm.factory import close_scheduler, slurm_scheduler
from relaunch.connectors.temporal import connect
from relaunch.detection.signatures import Catalogue
from relaunch.models.config import ClusterConfig
from relaunch.models.recovery import task_queue
from relaunch.workflows.recovery import RecoveryWorkflow

log = logging.getLogger("relaunch.worker")

WORKFLOWS = [RecoveryWorkflow]


def activities_for(deps: Deps) -> list[Callable[..., Any]]:
    evidence, actions = EvidenceActivities(deps), ActionActivities(deps)
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
    ]


def build_worker(client: Client, deps: Deps, *, queue: str | None = None) -> Worker:
    return Worker(
        client,
        task_queue=queue or task_queue(deps.config.name),
        workflows=WORKFLOWS,
        activities=activities_for(deps),
        graceful_shutdown_timeout=timedelta(seconds=20),
    )


async def run_worker(config: ClusterConfig) -> None:
    log_store = open_log_store(config.logs)  # first: a missing secret fails before connecting
    scheduler = slurm_scheduler(config)  # reads the slurmrestd JWT key, if any, now
    # Compile the signature catalogue now (about 2 s with hyperscan), not in the first recovery.
    await asyncio.to_thread(Catalogue.load)
    client = await connect(config)
    audit = await AuditStore.open(config.database_url)
    deps = Deps(config=config, scheduler=scheduler, audit=audit, log_store=log_store)
    worker = build_worker(client, deps)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    log.info("worker for cluster %s on task queue %s", config.name, task_queue(config.name))
    try:
        async with worker:
            await stop.wait()
            log.info("shutting down")
    finally:
        await deps.close()
        await audit.close()
        await close_scheduler(scheduler)
        if log_store is not None:
            await log_store.aclose()
