"""`relaunch watch`: the watcher process for one cluster. Each detection starts or joins the
job attempt's RecoveryWorkflow."""

from __future__ import annotations

import asyncio
import logging
import signal

from relaunch.connectors.slurm.cli import SlurmCli
from relaunch.connectors.slurm.factory import close_scheduler, slurm_scheduler
from relaunch.models.config import ClusterConfig
from relaunch.models.recovery import Detection
from relaunch.models.scheduler import Job, Node
from relaunch.workers import recovery_client
from relaunch.workers.watcher import WatchConfig, Watcher
from relaunch.workers.worker import connect

log = logging.getLogger("relaunch.watch")


class BriefListing:
    """The watcher's view of a scheduler: the cheap job listing (squeue's text format) for its
    polls; nodes as they are."""

    def __init__(self, scheduler: SlurmCli) -> None:
        self._scheduler = scheduler

    async def list_jobs(self) -> list[Job]:
        return await self._scheduler.list_jobs_brief()

    async def list_nodes(self) -> list[Node]:
        return await self._scheduler.list_nodes()


def watch_config(config: ClusterConfig) -> WatchConfig:
    return WatchConfig(
        cluster=config.name,
        partitions=config.watch.partitions,
        opt_in_comment=config.watch.opt_in_comment,
        poll_interval_s=config.watch.poll_interval_s,
        log_interval_s=config.watch.log_interval_s,
        hang_threshold_s=config.watch.hang_threshold_s,
        node_log_pattern=config.node_log_pattern,
        telemetry_pattern=config.telemetry_pattern,
        progress_pattern=config.watch.progress_pattern,
        job_output=config.job_output,
    )


async def run_watch(config: ClusterConfig, stop: asyncio.Event | None = None) -> None:
    scheduler = slurm_scheduler(config)  # reads the slurmrestd JWT key, if any, now
    client = await connect(config)

    async def on_detection(det: Detection) -> None:
        started = await recovery_client.start_or_join(client, config, det)
        log.info(
            "%s %s: job %s attempt %s %s",
            "started" if started else "joined/closed",
            det.workflow_id,
            det.job_id,
            det.attempt,
            det.kind,
        )

    watcher = Watcher(watch_config(config), BriefListing(scheduler), on_detection)
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    log.info("watching cluster %s every %.1fs", config.name, config.watch.poll_interval_s)
    try:
        await watcher.run(stop)
    finally:
        await close_scheduler(scheduler)
