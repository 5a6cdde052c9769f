"""`relaunch watch`: the watcher process for one cluster. Each detection starts or joins the
job attempt's RecoveryWorkflow (later ones held and handed over together); a node that failed
by trusted evidence (its probes, an Xid in its own kernel log) is reported at once to the
node's NodeDecisionWorkflow.

Several may run for one cluster: only the one that holds the cluster's lease acts, the others
wait as standbys and take over when it stops or dies (relaunch/workers/watch_lease.py)."""

from __future__ import annotations

import asyncio
import logging
import signal
import time
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path

from relaunch.connectors.audit import refuse_behind_schema
from relaunch.connectors.liveness import LivenessMonitor, make_prober
from relaunch.connectors.slurm.accounting import EndedJobs
from relaunch.connectors.slurm.commands import SlurmCli
from relaunch.connectors.slurm.factory import close_scheduler, slurm_scheduler
from relaunch.connectors.slurm.ssh import SshRunner
from relaunch.connectors.temporal import connect
from relaunch.connectors.tracing import node_report_span, start_tracing
from relaunch.models.config import ClusterConfig, ProbeMethod, WatchPaces, listen_address
from relaunch.models.errors import RelaunchError
from relaunch.models.node_decision import NodeReport
from relaunch.models.recovery import Detection, RestartMethod
from relaunch.models.scheduler import Job, Node, watched
from relaunch.models.tracing import ATTR_INCIDENT
from relaunch.workers.process_metrics import Health, WatchMetrics, serving
from relaunch.workers.watch_catchup import CatchUp, CatchUpSink, CaughtUp, Sink
from relaunch.workers.watch_drains import AuditDrainRecorder
from relaunch.workers.watch_lease import WatchLease
from relaunch.workers.watcher import WatchConfig, Watcher
from relaunch.workflows import recovery_client
from relaunch.workflows.node_client import NodeDecisionSignals

log = logging.getLogger("relaunch.watch")

# A lease loop (standby tries, leader confirmations: every second) this long silent is stuck.
LEASE_STALE_S = 10.0


class BriefSchedulerView:
    """The watcher's view of a scheduler: the cheap job listing (squeue's text format) for its
    polls, the active jobs alone between them (relaunch/workers/watch_cadence.py); nodes as
    they are."""

    def __init__(self, scheduler: SlurmCli) -> None:
        self._scheduler = scheduler

    async def list_jobs(self) -> list[Job]:
        return await self._scheduler.list_jobs_brief()

    async def list_active_jobs(self) -> list[Job]:
        return await self._scheduler.list_jobs_active()

    async def list_nodes(self) -> list[Node]:
        return await self._scheduler.list_nodes()


def watch_config(config: ClusterConfig) -> WatchConfig:
    """The watcher's settings; the probes' (``probe_*``) go to :func:`liveness_monitor`."""
    return WatchConfig(
        cluster=config.name,
        partitions=config.watch.partitions,
        opt_in_comment=config.watch.opt_in_comment,
        **config.watch.model_dump(include=set(WatchPaces.model_fields)),  # how often what
        log_interval_s=config.watch.log_interval_s,
        hang_threshold_s=config.watch.hang_threshold_s,
        lag_floor_s=config.watch.lag_floor_s,
        heartbeat_timeout_s=config.watch.heartbeat_timeout_s,
        node_log_pattern=config.node_log_pattern,
        telemetry_pattern=config.telemetry_pattern,
        launcher_health_pattern=config.launcher_health_pattern,
        progress_pattern=config.watch.progress_pattern,
        follow_up_hold_s=config.watch.follow_up_hold_s,
        job_output=config.job_output,
    )


async def run_watch(config: ClusterConfig, stop: asyncio.Event | None = None) -> None:
    await refuse_behind_schema(config.database_url)  # never migrates: `relaunch db migrate`
    scheduler = slurm_scheduler(config)  # reads the slurmrestd JWT key, if any, now
    tracing = start_tracing(config, "watch")
    client = await connect(config, tracing.interceptors)

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

    signals = NodeDecisionSignals(client)

    async def on_node_report(report: NodeReport) -> bool:
        with node_report_span(config.name, report.node) as span:
            decision, started = await signals.report(
                config.name, report.node, config.policy, report
            )
            span.set_attribute(ATTR_INCIDENT, decision)
        log.info(
            "reported node %s to %s%s: %s",
            report.node,
            decision,
            "" if started else " (running already)",
            report.text,
        )
        return started

    async def on_follow_ups(dets: list[Detection]) -> None:
        handed = await recovery_client.hand_over(client, config, dets)
        log.info(
            "%s %s: %d later detections of job %s attempt %s",
            "handed over" if handed else "closed",
            dets[0].workflow_id,
            len(dets),
            dets[0].job_id,
            dets[0].attempt,
        )

    policy = config.policy
    # Only where node decisions run at all (see planning.node_decision_nodes).
    reports = policy.node_decisions and policy.restart_method is RestartMethod.REQUEUE
    drains = AuditDrainRecorder(config.database_url)  # external drains: watch_drains.py
    caught_up = CatchUpSink(config.database_url)  # missed job ends: watch_catchup.py
    # Every act (a recovery started or signalled, a node reported, a row written) goes
    # through the lease: only the leader acts, and only while its lease is confirmed.
    lease = WatchLease(config.name, config.database_url)
    act = lease.guard
    # One set of series for the process (relaunch/workers/process_metrics.py): each term's
    # watcher adds to it; a standby is healthy while its lease loop runs, a leader while it polls.
    terms: list[Watcher] = []
    metrics = WatchMetrics(config.name, lambda: terms[-1].probe_counts() if terms else (0, 0, 0))
    metrics.poll_interval_s = config.watch.poll_interval_s
    metrics.reconcile_s = config.watch.active_interval_s  # listings that far apart at most
    metrics.standby = True

    def lease_alive(now: float) -> str | None:
        age = lease.loop_age_s(now)
        return f"the lease's loop stalled: {age:.0f}s" if age > LEASE_STALE_S else None

    async def lead(end: asyncio.Event) -> None:
        """One term as the cluster's leader: a fresh watcher, as at start-up, until ``end``."""
        probe_runner, liveness = await liveness_monitor(config)
        watcher = Watcher(
            watch_config(config),
            BriefSchedulerView(scheduler),
            act(on_detection),
            liveness=liveness,
            on_node_report=act(on_node_report) if reports else None,
            report_acts_alone=lambda report: policy.acts_alone(report.partitions, report.category),
            on_follow_ups=act(on_follow_ups),
            on_external_drains=act(drains),
            catch_up=catch_up(config, scheduler, LeaderSink(caught_up, lease)),
            metrics=metrics,
        )
        w = config.watch
        log.info(
            "watching cluster %s: jobs listed every %g-%gs (at most %g%% of the time), "
            "logs read every %gs",
            config.name,
            w.poll_interval_s,
            w.reconcile_s,
            w.listing_share * 100,
            w.log_interval_s,
        )
        terms.append(watcher)
        metrics.leading_since, metrics.standby = time.monotonic(), False
        try:
            await watcher.run(end)
        finally:
            metrics.standby = True
            terms.remove(watcher)
            if liveness is not None:
                await liveness.prober.close()
            if probe_runner is not None:
                await probe_runner.close()

    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    health = Health()
    health.checks.append(metrics.check(health.started))
    health.checks.append(lease_alive)
    address = listen_address(config.metrics.watch_address)
    try:
        async with serving(address, metrics.registry, health, what="watcher"):
            await lease.run(stop, lead)
    finally:
        await close_scheduler(scheduler)
        await drains.close()
        await caught_up.close()
        tracing.shutdown()


class LeaderSink:
    """The catch-up's sink, writing only while this watcher leads (reading at any time)."""

    def __init__(self, sink: CatchUpSink, lease: WatchLease) -> None:
        self._sink, self._lease = sink, lease

    async def handled(self, cluster: str, job: Job) -> bool:
        return await self._sink.handled(cluster, job)

    async def record(self, caught: Sequence[CaughtUp]) -> int:
        await self._lease.ensure()
        return await self._sink.record(caught)


def catch_up(config: ClusterConfig, scheduler: SlurmCli, sink: Sink) -> CatchUp:
    """The catch-up from accounting ``config.watch`` asks for (watch_catchup.py): the same
    jobs as the live watcher's (``watched``), ended jobs read through ``sacct``."""
    watch = config.watch

    def watches(job: Job) -> bool:
        return watched(
            job, config.name, partitions=watch.partitions, opt_in_comment=watch.opt_in_comment
        )

    async def read(since: datetime, until: datetime, limit: int) -> EndedJobs:
        return await scheduler.ended_jobs(since, until, limit=limit)

    catch = CatchUp(
        config.name,
        read,
        watches,
        sink,
        window_s=watch.catch_up_window_s,
        gap_s=watch.catch_up_gap_s,
        limit=watch.catch_up_max_jobs,
        state_file=Path(watch.state_file) if watch.state_file else None,
    )
    if catch.enabled:
        log.info(
            "job ends missed while not watching are read from accounting, %.0fs back at most",
            watch.catch_up_window_s,
        )
    return catch


async def liveness_monitor(
    config: ClusterConfig,
) -> tuple[SshRunner | None, LivenessMonitor | None]:
    """The liveness monitor ``config.watch`` asks for, and the SSH runner its probes use.

    With ``ssh`` set and the ``auto`` method the probes run on that host (it reaches the
    nodes' slurmd when this one may not), over a connection of their own: a round a second
    must not take the sessions the Slurm commands need. A prober that cannot be built
    (``syn`` without CAP_NET_RAW) is said once, and the watcher runs without probes:
    everything else it watches still counts."""
    settings = config.watch
    if not settings.probe_enabled:
        return None, None
    runner = None
    if config.ssh is not None and settings.probe_method is ProbeMethod.AUTO:
        runner = SshRunner(config.ssh, env=config.remote_slurm_env)
    try:
        prober = make_prober(settings.probe_method, runner=runner)
    except (RelaunchError, ValueError) as exc:
        log.error("liveness probes are off: %s", exc, extra={"error": str(exc)})
        if runner is not None:
            await runner.close()
        return None, None
    monitor = LivenessMonitor(
        prober,
        interval_s=settings.probe_interval_s,
        timeout_s=settings.probe_timeout_s,
        failures=settings.probe_failures,
    )
    log.info(
        "probing the slurmd of watched nodes every %.1fs (%s, %d failures in a row: unreachable)",
        settings.probe_interval_s,
        prober.method,
        settings.probe_failures,
    )
    return runner, monitor
