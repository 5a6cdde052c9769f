"""The watcher: notices, within seconds, that a watched job was interrupted or is stuck.

Each poll makes one ``list_jobs()`` and at most one ``list_nodes()`` call (none when no watched
job runs), then reads only the bytes appended since the last poll to each watched job's stdout
and stderr and to its nodes' kernel logs. What it finds becomes :class:`Detection` records,
each reported once per job attempt (same kind, same nodes: reported once). How often the jobs
and the nodes are listed follows what a listing costs and what happens, not a fixed second
(relaunch/workers/watch_cadence.py); the logs are read every ``log_interval_s`` between.

Choices worth knowing:

- A job seen for the first time is read from the start of its log on its first attempt, else
  from the current end (lines of earlier attempts must not be charged to this one). Node logs
  always start at their current end. Offsets survive requeues: the log keeps growing.
- A node's kernel log and telemetry are read once per pass, however many watched jobs run on
  it, and what they hold is news to each job from the pass after it first looked at the node.
- A requeue Slurm did by itself is reported with the attempt it interrupted (the old restart
  count), and so are the log lines read in that same poll.
- Only ``root`` and ``cascade`` signatures are reported, and only a root names nodes; a cascade
  comes from a healthy reporter and would blame the wrong node.
- What a job prints is bounded before it costs anything: each pass scans at most
  ``max_job_bytes_per_pass`` of a job's output (the rest waits for the next pass, counted in
  ``WatchStats.backlogged``), lines are matched on their first 4 KiB (``long_lines``), a
  progress tracker follows no more ranks than the job has tasks, hostlists are expanded only
  up to the allocation's size, and a job line's stated time counts only when plausible.
- Rank → node: a ``node=`` field on the rank's progress lines wins; otherwise Slurm's default
  block layout is assumed (task ``i`` of ``n`` per node runs on ``job.nodes[i // n]``; with one
  task per node, rank ``i`` is on ``job.nodes[i]``).
- Limits follow the job. A whole-job stall (``hang``) is reported after max(``hang_threshold_s``,
  ``stall_k`` × the median step interval, 1.5 × the longest pause already seen), a rank left
  behind while its peers go on (``progress_stalled_rank``) after max(``lag_floor_s``, ``stall_k``
  × the median step interval). A job's comment ``hang_after=10m`` / ``lag_after=30s`` replaces
  the floor for that job only (5 s to 7 days; a bad value is ignored with one warning).
- Nodes that die without a word (slurmd probes, node agents' heartbeats) are followed by
  :class:`relaunch.workers.watch_liveness.Liveness`; see that module.
- A node that failed by trusted evidence is also reported to its node decision, and the later
  signs of an interruption already handed over are held and handed over together:
  relaunch/workers/watch_handover.py.
- Job ends missed while the watcher was down (or could not list) are read from Slurm's
  accounting at the first good poll after: relaunch/workers/watch_catchup.py.
- Drains of watched jobs' nodes that Relaunch did not make (NHC, an admin) are read back from
  the poll's node listing and recorded once each: relaunch/workers/watch_drains.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

from pydantic import Field, field_validator

from relaunch.connectors.joboutput import FileAccess
from relaunch.connectors.launcher_health import FitFiles, LauncherHealth
from relaunch.connectors.lease import LeaseLostError
from relaunch.connectors.liveness import LivenessMonitor
from relaunch.connectors.logs import FileTail
from relaunch.connectors.slurm.commands import LINEAGE_KEY
from relaunch.connectors.telemetry import TelemetryTail
from relaunch.detection.findings import normalise_host, telemetry_findings
from relaunch.detection.progress import MAX_RANKS, ProgressTracker
from relaunch.detection.signatures import MAX_LINE, Catalogue, Culprit, Role, SignatureMatch
from relaunch.models.config import (
    HANG_FLOOR_WHY,
    LAG_FLOOR_WHY,
    JobOutputSettings,
    WatchPaces,
)
from relaunch.models.errors import RelaunchError
from relaunch.models.node_decision import NodeReport
from relaunch.models.recovery import TRUSTED_DETECTION_SOURCES, Detection, DetectionSource
from relaunch.models.scheduler import (
    MAX_AFTER_S,
    Job,
    JobState,
    Node,
    NodeFlag,
    NodeState,
    watched,
)
from relaunch.workers.process_metrics import WatchMetrics
from relaunch.workers.watch_cadence import Cadence, CadenceSettings
from relaunch.workers.watch_catchup import CatchUp
from relaunch.workers.watch_drains import DrainRecorder, ExternalDrains
from relaunch.workers.watch_handover import (
    REPORT_LEAD_S,
    REPORT_SEND_S,
    FollowUps,
    NodeReportHandler,
    NodeReports,
)
from relaunch.workers.watch_liveness import Liveness
from relaunch.workers.watch_state import (
    JobWatch,
    LogPace,
    NodeFeed,
    Poll,
    Stream,
    WatchStats,
    writes_output,
)

logger = logging.getLogger(__name__)

REPORTED_ROLES = frozenset({Role.ROOT, Role.CASCADE})
# A pass over the watched jobs lets the rest of the watcher run (the handover to Temporal, the
# liveness probes) at least this often.
PASS_SLICE_S = 0.05
# A job that ended abnormally on a node this long before the node's report was hit by its
# failure (see Watcher._running_on).
ENDED_HIT = timedelta(seconds=60)


class SchedulerView(Protocol):
    """The two batched reads the watcher needs (``SlurmCli`` and ``SlurmRest`` provide them).
    A view that also has ``list_active_jobs()`` (the jobs in any state but pending) is read
    that way between full listings (relaunch/workers/watch_cadence.py)."""

    async def list_jobs(self) -> list[Job]: ...

    async def list_nodes(self) -> list[Node]: ...


DetectionHandler = Callable[[Detection], Awaitable[None]]
FollowUpHandler = Callable[[list[Detection]], Awaitable[None]]


class WatchConfig(WatchPaces):
    """What to watch and how closely."""

    cluster: str = Field(min_length=1)
    partitions: list[str] = Field(default_factory=list, description="watched wholesale")
    opt_in_comment: bool = Field(default=True, description="watch jobs with relaunch=on")
    log_interval_s: float = Field(
        default=0.25, gt=0, description="between polls, how often watched jobs' logs are read"
    )
    hang_threshold_s: float = Field(default=45.0, ge=5, le=MAX_AFTER_S, description=HANG_FLOOR_WHY)
    lag_floor_s: float = Field(default=5.0, ge=1, le=MAX_AFTER_S, description=LAG_FLOOR_WHY)
    stall_k: float = Field(default=10.0, gt=0, description="stall = k × the median step time")
    heartbeat_timeout_s: float = Field(
        default=15.0, ge=1, le=3600, description="an agent heard, then silent this long: lost"
    )
    node_log_pattern: str | None = Field(default=None, description="with {node}, per node")
    telemetry_pattern: str | None = Field(
        default=None,
        description="the node agents' telemetry.jsonl files, with {node} (their heartbeat "
        "files are beside them)",
    )
    launcher_health_pattern: str | None = Field(
        default=None,
        description="each node's health file for the jobs' launchers, with {node}: written for "
        "every node in service (docs/spares.md)",
    )
    progress_pattern: str | None = Field(default=None, description="a regex with group `step`")
    max_read_bytes: int = Field(default=8 << 20, gt=0, description="per file per poll")
    max_job_bytes_per_pass: int = Field(
        default=4 << 20,
        gt=0,
        description="log bytes scanned per job per pass (stdout and stderr together); the "
        "rest is read in later passes, so one flooding job cannot starve the others",
    )
    job_output: JobOutputSettings = Field(
        default_factory=JobOutputSettings, description="which job output files may be read"
    )
    max_pending: int = Field(default=10_000, gt=0, description="undelivered detections kept")
    deliver_parallel: int = Field(
        default=32, gt=0, description="recoveries started or signalled at once"
    )
    follow_up_hold_s: float = Field(
        default=10.0,
        ge=0,
        le=60,
        description="later signs of an interruption already handed over are held this long and "
        "handed over together, in one signal (0: each at once); see watch_handover.py",
    )

    @field_validator("node_log_pattern", "telemetry_pattern", "launcher_health_pattern")
    @classmethod
    def _has_node(cls, value: str | None) -> str | None:
        if value is not None and "{node}" not in value:
            raise ValueError("a per-node pattern must contain {node}")
        return value


class Watcher:
    """Polls a cluster and turns what it sees into detections (see the module docstring)."""

    def __init__(
        self,
        config: WatchConfig,
        scheduler: SchedulerView,
        on_detection: DetectionHandler,
        *,
        catalogue: Catalogue | None = None,
        liveness: LivenessMonitor | None = None,
        on_node_report: NodeReportHandler | None = None,
        report_acts_alone: Callable[[NodeReport], bool] | None = None,
        on_follow_ups: FollowUpHandler | None = None,
        on_external_drains: DrainRecorder | None = None,
        catch_up: CatchUp | None = None,
        metrics: WatchMetrics | None = None,
    ) -> None:
        self.config = config
        self.stats = WatchStats()
        # The Prometheus series (relaunch/workers/process_metrics.py); served where configured.
        # A process that leads by turns (the lease) keeps one set across its watchers.
        self.metrics = metrics or WatchMetrics(config.cluster, self.probe_counts)
        self.metrics.poll_interval_s = config.poll_interval_s
        # A listing (of every job, or of the active ones between) at least this often: how old
        # the last good one may be before the watcher's health turns red.
        self._active_listing = hasattr(scheduler, "list_active_jobs")
        self.metrics.reconcile_s = (
            config.active_interval_s if self._active_listing else config.reconcile_s
        )
        self.cadence = Cadence(
            CadenceSettings(
                poll_interval_s=config.poll_interval_s,
                listing_share=config.listing_share,
                listing_share_busy=config.listing_share_busy,
                reconcile_s=max(config.reconcile_s, config.poll_interval_s),
                active_interval_s=config.active_interval_s,
                node_interval_s=config.node_interval_s,
                busy_s=config.busy_s,
            )
        )
        self._scheduler = scheduler
        self._on_detection = on_detection
        self._on_follow_ups = on_follow_ups
        self._follow_ups = FollowUps(config.follow_up_hold_s if on_follow_ups else 0.0)
        self._follow_ups_failed = False
        self._catalogue = catalogue or Catalogue.load()
        self._jobs: dict[str, JobWatch] = {}
        self._reports = NodeReports(on_node_report, self._running_on, report_acts_alone)
        self._nodes: dict[str, NodeFeed] = {}
        self._last_nodes: dict[str, Node] = {}  # the last node listing (watch_cadence.py)
        self._running = 0  # watched jobs RUNNING at the last pass
        # The watched jobs that ran or run (not the thousands that wait): what the log passes,
        # the active listing and the loop look at, not every watched job each time.
        self._readable: dict[str, JobWatch] = {}
        self._drains = ExternalDrains(config.cluster, on_external_drains)
        pattern = config.launcher_health_pattern
        self._fit_files = FitFiles(LauncherHealth(pattern)) if pattern else None
        self._fit_task: asyncio.Future[None] | None = None
        self._catch_up = catch_up  # job ends missed while not looking: watch_catchup.py
        self._pass = 0
        # Held through a pass (a poll's or a log read's): a pass may wait for the node reports
        # it found to go out, and no other pass may start meanwhile (each node's feed is read
        # once a pass, and every job of the pass takes its news from that read).
        self._pass_lock = asyncio.Lock()
        self._slow_said_at = -math.inf
        self._liveness = Liveness(
            liveness,
            self.stats,
            telemetry_pattern=config.telemetry_pattern,
            heartbeat_timeout_s=config.heartbeat_timeout_s,
            hang_floor_s=config.hang_threshold_s,
            lag_floor_s=config.lag_floor_s,
        )

    def watches(self, job: Job) -> bool:
        """See :func:`relaunch.models.scheduler.watched`."""
        cfg = self.config
        return watched(
            job, cfg.cluster, partitions=cfg.partitions, opt_in_comment=cfg.opt_in_comment
        )

    async def poll_once(self, now: datetime | None = None) -> list[Detection]:
        """One look at the cluster: the jobs, their nodes, and a pass over the watched jobs.
        An injected ``now`` also drives the progress clock."""
        started = time.monotonic()
        listing = await self._scheduler.list_jobs()
        self.cadence.jobs_listed(started, time.monotonic() - started)
        jobs = [job for job in listing if self.watches(job)]
        polled_at = now or datetime.now(UTC)
        found = await self._pass_over(jobs, started, now)
        for gone in set(self._jobs) - {job.job_id for job in jobs}:
            del self._jobs[gone]
        self._readable = {
            job_id: w
            for job_id, w in self._jobs.items()
            if w.job.state is not JobState.PENDING or w.logs
        }
        self._count_running()
        in_use = {node for watch in self._jobs.values() for node in watch.job.nodes}
        for idle in set(self._nodes) - in_use:
            del self._nodes[idle]
        self.stats.polls += 1
        self.stats.watched_jobs = len(jobs)
        self.stats.detections += len(found)
        self.stats.last_poll_s = time.monotonic() - started
        self.metrics.polled(self.stats.last_poll_s, len(jobs), len(in_use))
        self.metrics.detected(found)
        self._slow_pass("poll", self.stats.last_poll_s)
        if self._catch_up is not None:
            self._catch_up.after_poll(polled_at, {j.job_id for j in listing}, time.monotonic())
        return found

    async def poll_active(self) -> list[Detection]:
        """Between two full listings (relaunch/workers/watch_cadence.py): the jobs in any state
        but pending, and a pass over the watched ones. A job that starts is watched from here;
        a watched job that left this listing (pending again: requeued) makes the watcher busy
        and the next full listing come sooner, which tells what became of it."""
        started = time.monotonic()
        list_active = getattr(self._scheduler, "list_active_jobs", None)
        if list_active is None:
            return await self.poll_once()
        listing: list[Job] = await list_active()
        self.cadence.active_listed(started)
        active = [job for job in listing if self.watches(job)]
        listed = {job.job_id for job in active}
        left = [
            w.job.job_id
            for job_id, w in self._readable.items()
            if job_id not in listed and w.job.state is not JobState.PENDING
        ]
        if left:
            self.cadence.stir(started)
            logger.debug("watched jobs left the active listing: %s", left[:10])
        nodes_due = self.cadence.nodes_in(started, urgent=self._reports.deferring(started)) <= 0
        found = await self._pass_over(active, started, None, fresh_nodes=nodes_due)
        self.stats.active_polls += 1
        self.metrics.polled(time.monotonic() - started, len(self._jobs), len(self._nodes))
        self.stats.detections += len(found)
        self.metrics.detected(found)
        return found

    async def poll_nodes(self) -> list[Detection]:
        """Between two job listings (relaunch/workers/watch_cadence.py): the nodes again, and
        a pass over the jobs of the last listing with their fresh states (a node down, a
        drain someone made, a node a recovery waits to see drained)."""
        started = time.monotonic()
        jobs = [w.job for w in self._readable.values() if w.job.state is not JobState.PENDING]
        found = await self._pass_over(jobs, started, None)
        self.stats.node_polls += 1
        self.stats.detections += len(found)
        self.metrics.detected(found)
        return found

    def _nodes_wanted(self, jobs: list[Job], now: float) -> bool:
        """The nodes while a job runs, or while a recovery waits to see its node drained (its
        job requeued ahead by the node's decision may run nowhere meanwhile)."""
        return self._reports.deferring(now) or any(job.state is JobState.RUNNING for job in jobs)

    def _running_watched(self) -> bool:
        """Whether a watched job ran at the last pass (kept by the passes: a loop that asks
        many times a second must not look at 10,000 jobs each time)."""
        return self._running > 0

    async def _pass_over(
        self, jobs: list[Job], started: float, now: datetime | None, *, fresh_nodes: bool = True
    ) -> list[Detection]:
        """The nodes (when wanted: listed again when ``fresh_nodes``, else as last listed), then
        one pass over ``jobs``: what each shows that is new."""
        if now is None:
            wall, clock = datetime.now(UTC), time.monotonic()
        else:
            wall = now if now.tzinfo else now.replace(tzinfo=UTC)
            clock = wall.timestamp()
        nodes: dict[str, Node] = {}
        if self._nodes_wanted(jobs, started):
            if fresh_nodes or not self._last_nodes:
                nodes = {node.name: node for node in await self._scheduler.list_nodes()}
                self._last_nodes = nodes
                self.cadence.nodes_listed(started)
                self._reports.nodes_seen({n for n, node in nodes.items() if node.drain_flag})
                self._drains.observe(jobs, nodes, wall, time.monotonic())
                self._mark_fit(nodes.values())
            else:  # the last listing's: their addresses for the probes, their states as seen
                nodes = self._last_nodes
        found: list[Detection] = []
        async with self._pass_lock:
            self._pass += 1
            self._liveness.update(jobs, nodes, wall)
            self._read_nodes()
            slice_end = await self._between_jobs(time.monotonic() + PASS_SLICE_S)
            for job in jobs:
                if now is None:  # per job, as in read_logs_once
                    wall, clock = datetime.now(UTC), time.monotonic()
                found.extend(self._check_job(job, nodes, wall, clock))
                slice_end = await self._between_jobs(slice_end)
        for job in jobs:  # a job that started since the last pass (any pass may see one)
            watch = self._jobs.get(job.job_id)
            if watch is not None and (job.state is not JobState.PENDING or watch.logs):
                self._readable[job.job_id] = watch
        self._count_running()
        return found

    def _mark_fit(self, nodes: Iterable[Node]) -> None:
        """The launchers' health files of the nodes due, in a thread of their own: a pass never
        waits on the file system they live on (one batch at a time)."""
        fit = self._fit_files
        if fit is None or (self._fit_task is not None and not self._fit_task.done()):
            return
        due = fit.due(nodes, time.monotonic())
        if due:
            self._fit_task = asyncio.ensure_future(asyncio.to_thread(fit.mark, due))

    def _count_running(self) -> None:
        self._running = sum(1 for w in self._readable.values() if w.job.state is JobState.RUNNING)

    async def _send_reports(self) -> None:
        """Send the node reports waiting (their signals out; the answers may come later)."""
        self._reports.start([])
        await self._reports.wait(timeout=REPORT_SEND_S)

    async def _between_jobs(self, slice_end: float) -> float:
        """Between two jobs of a pass: send the node reports waiting, and let the handover
        and the probes run once the pass has held the event loop for PASS_SLICE_S (a pass
        over hundreds of jobs takes seconds on a machine the failure keeps busy). The end of
        the next slice."""
        if self._reports.waiting:
            await self._send_reports()
        elif time.monotonic() < slice_end:
            return slice_end
        else:
            await asyncio.sleep(0)
        return time.monotonic() + PASS_SLICE_S

    def _read_nodes(self) -> None:
        """Read every watched node's kernel log and telemetry first in a pass, before any
        job's output: a node's Xid is then reported at the start of the pass that reads it,
        not when the pass reaches the node's first job (seconds later, at hundreds of jobs).
        Each job still takes the lines as news in its own turn (`_node_news`)."""
        for node in list(self._nodes):
            self._feed(node)

    def _log_pass(self, now: datetime | None) -> Iterator[list[Detection]]:
        """One pass over the watched jobs' logs: each job's new detections, job by job
        (the nodes' own logs first, as one step of their own)."""
        self._pass += 1
        self._liveness.refresh()
        self._read_nodes()
        yield []
        for watch in list(self._readable.values()):
            if watch.job.state is JobState.PENDING and not watch.logs:
                continue  # never ran while watched: 10,000 queued jobs cost no file access
            # Stamped per job, not once per pass: a pass over hundreds of jobs takes a while,
            # and a line read late in it must not look detected before it was written.
            wall = now or datetime.now(UTC)
            clock = wall.timestamp() if now else time.monotonic()
            poll = Poll(self.config.cluster, watch.job, watch, watch.restart_count, wall, clock)
            self._job_logs(poll)
            self._node_news(poll)
            self._liveness.news(poll)
            yield [d for d in poll.found if watch.first_time(d)]

    def read_logs_once(self, now: datetime | None = None) -> list[Detection]:
        """Between polls: read what watched jobs' logs gained since the last read, without
        asking the scheduler (a line is seen within ``log_interval_s``, not a whole poll)."""
        found = [d for dets in self._log_pass(now) for d in dets]
        self.stats.detections += len(found)
        self.metrics.detected(found)
        return found

    async def read_logs(self) -> list[Detection]:
        """:meth:`read_logs_once` as the watcher runs it: when a node's own kernel log says the
        node failed (an Xid the catalogue drains for), its report goes out at once, in the
        middle of the pass, not after the pass over hundreds of jobs' logs (seconds, on a
        machine the failure itself keeps busy)."""
        found: list[Detection] = []
        async with self._pass_lock:
            slice_end = time.monotonic() + PASS_SLICE_S
            for dets in self._log_pass(None):
                found.extend(dets)
                slice_end = await self._between_jobs(slice_end)
        self.stats.detections += len(found)
        self.metrics.detected(found)
        return found

    async def run(self, stop: asyncio.Event) -> None:
        """Poll until ``stop`` is set, reading logs every ``log_interval_s`` in between, and
        hand each detection to ``on_detection``. Scheduler errors are logged and the next poll
        tries again; a detection whose delivery fails is kept and delivered later."""
        pending: deque[Detection] = deque()
        found = asyncio.Event()
        # Handing detections to Temporal runs beside the polling: a slow handover (a burst, a
        # loaded server) never delays reading the next log line.
        handover = asyncio.create_task(self._deliver_until(stop, pending, found))
        # So does the scheduler's listing: while squeue is slow (a busy controller, thousands
        # of jobs), logs are still read every log_interval_s. A poll's own pass over the jobs
        # and a log pass never interleave: each holds the pass lock while it sends the node
        # reports it found (a log pass due meanwhile is skipped).
        poll: asyncio.Task[list[Detection]] | None = None
        stopped = asyncio.create_task(stop.wait())
        # The liveness probes keep their own pace (a round every probe_interval_s); the passes
        # only read the monitor's state.
        monitor = self._liveness.monitor
        probing = asyncio.create_task(monitor.run(stop)) if monitor else None
        cadence = self.cadence
        try:
            while not stop.is_set():
                try:
                    if poll is None:
                        poll = self._listing_due(time.monotonic())
                    if poll is not None and poll.done():
                        done, poll = poll, None
                        if done.exception() is not None:
                            self.metrics.poll_failed()
                        new = done.result()
                    elif not self._pass_lock.locked():  # else a poll's pass is under way
                        began = time.monotonic()
                        new = await self.read_logs()
                        self._slow_pass("log read", time.monotonic() - began)
                    else:
                        new = []
                    if new:
                        cadence.stir(time.monotonic())
                        self._reports.start(new)
                        pending.extend(new)
                        found.set()
                except RelaunchError as exc:
                    self._failed(exc, retryable=exc.retryable)
                except Exception as exc:
                    logger.exception("watcher poll failed unexpectedly")
                    self._failed(exc, retryable=False)
                while len(pending) > self.config.max_pending:
                    dropped = pending.popleft()
                    logger.error("dropping undelivered detection", extra=_fields(dropped))
                wake = time.monotonic() + self.config.log_interval_s
                if poll is None:
                    wake = min(wake, time.monotonic() + self._listing_in(time.monotonic()))
                waits: set[asyncio.Future[Any]] = {stopped}
                if poll is not None:
                    waits.add(poll)  # its result is handled as soon as it comes
                await asyncio.wait(
                    waits,
                    timeout=max(0.0, wake - time.monotonic()),
                    return_when=asyncio.FIRST_COMPLETED,
                )
        finally:
            for task in (poll, stopped, probing):
                if task is not None and not task.done():
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError, Exception):
                        await task
            await self._reports.wait(timeout=10)
            await self._drains.wait(timeout=5)
            if self._catch_up is not None:
                await self._catch_up.wait(timeout=10)
            found.set()  # a last handover of what is pending, then stop
            with contextlib.suppress(TimeoutError, asyncio.CancelledError):
                await asyncio.wait_for(handover, timeout=10)

    def _listing_in(self, now: float) -> float:
        """Seconds until the next listing (of all jobs, the active ones, or the nodes)."""
        due = self.cadence.jobs_in(now)
        if self._active_listing:
            due = min(due, self.cadence.active_in(now))
        deferring = self._reports.deferring(now)
        if deferring or self._running_watched():
            due = min(due, self.cadence.nodes_in(now, urgent=deferring))
        return due

    def _listing_due(self, now: float) -> asyncio.Task[list[Detection]] | None:
        """The listing due now, started (see relaunch/workers/watch_cadence.py), if any: all
        the jobs, the active ones (with their nodes when those are due), or the nodes."""
        # Each attempt counts as begun now, whether it succeeds or not: a controller that
        # fails is asked again at the same pace, not at every turn of the loop.
        cadence = self.cadence
        if cadence.jobs_in(now) <= 0:
            cadence.jobs_tried(now)
            return asyncio.create_task(self.poll_once())
        if self._active_listing and cadence.active_in(now) <= 0:
            cadence.active_listed(now)
            return asyncio.create_task(self.poll_active())
        if self._listing_in(now) <= 0:
            cadence.nodes_listed(now)
            return asyncio.create_task(self.poll_nodes())
        return None

    async def _deliver_until(
        self, stop: asyncio.Event, pending: deque[Detection], found: asyncio.Event
    ) -> None:
        """Hand pending detections over as they come; after a failure, try again a poll
        interval later. Ends once ``stop`` is set and a last attempt was made."""
        while True:
            await found.wait()
            found.clear()
            # The node reports go first: one decision per node drains it (and requeues its jobs)
            # while the recoveries of hundreds of jobs would still be queued at the server.
            await self._reports.wait(timeout=REPORT_LEAD_S)
            await self._deliver(pending, final=stop.is_set())
            if stop.is_set():
                return
            # Not delivered: try again later, or sooner when more is found; held signs of a
            # recovery, when their hold is over.
            retry = self.config.poll_interval_s
            wait = retry if pending or self._follow_ups_failed else None
            held = self._follow_ups.next_due_in(time.monotonic())
            if held is not None:
                wait = held if wait is None else min(wait, held)
            if wait is not None:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(found.wait(), timeout=wait)
                found.set()

    def _slow_pass(self, what: str, took: float) -> None:
        """Say so when one pass over the watched jobs takes longer than a second: detections
        are that much later (too many jobs for one watcher, or a starved machine). At most once
        a minute: a watcher over 10,000 jobs would otherwise say it at every poll."""
        now = time.monotonic()
        if took > 1.0 and now >= self._slow_said_at + 60:
            self._slow_said_at = now
            logger.warning(
                "%s over %d jobs took %.1fs", what, len(self._jobs), took, extra={"took_s": took}
            )

    def _failed(self, exc: Exception, *, retryable: bool) -> None:
        self.stats.errors += 1
        self.stats.last_error = str(exc)
        level = logging.WARNING if retryable else logging.ERROR
        logger.log(level, "poll failed", extra={"error": str(exc), "retryable": retryable})

    async def _deliver(self, pending: deque[Detection], *, final: bool = False) -> None:
        """Hand pending detections over: up to ``deliver_parallel`` recoveries at once (a
        switch that takes out a rack interrupts hundreds of jobs together, and each handover
        is a round trip to Temporal), one recovery's detections in order. After a failure
        nothing new is started; what was not delivered stays pending, in order. Later signs
        of a recovery already handed over are held and handed over together
        (watch_handover.py); ``final`` hands over everything held."""
        if not pending and not len(self._follow_ups):
            return
        now = time.monotonic()
        groups: dict[str, list[Detection]] = {}
        for det in pending:
            groups.setdefault(det.workflow_id, []).append(det)
        delivered = {id(det) for det in self._follow_ups.hold(groups, now)}
        if not final:  # the jobs a node decision is requeuing: started once it has drained
            groups = {w: d for w, d in groups.items() if not self._reports.defers(d[0], now)}
        gate = asyncio.Semaphore(self.config.deliver_parallel)
        failed = False

        async def one_recovery(workflow_id: str, dets: list[Detection]) -> None:
            nonlocal failed
            # What the job's user cannot write first: the recovery starts from it, and its
            # evidence reads the nodes it names (which Slurm may drop from an ending job).
            dets = sorted(dets, key=lambda d: d.source not in TRUSTED_DETECTION_SOURCES)
            async with gate:
                for det in dets:
                    if failed:
                        return
                    try:
                        await self._on_detection(det)
                    except LeaseLostError:  # another watcher leads now: not ours to deliver
                        failed = True
                        return
                    except Exception:
                        if not failed:
                            logger.exception("delivering a detection failed; retrying next poll")
                        failed = True
                        return
                    delivered.add(id(det))
                    logger.info("detection", extra=_fields(det))
                self._follow_ups.handed(workflow_id, now)

        async def follow_ups(workflow_id: str, dets: list[Detection]) -> None:
            assert self._on_follow_ups is not None
            async with gate:
                try:
                    await self._on_follow_ups(dets)
                except LeaseLostError:
                    return
                except Exception:
                    if not self._follow_ups_failed:
                        logger.exception("handing over held detections failed; retrying")
                    self._follow_ups_failed = True
                    return
            self._follow_ups.delivered(workflow_id)
            self._follow_ups_failed = False  # said once per outage, not at every retry
            logger.info(
                "held detections", extra={"workflow_id": workflow_id, "detections": len(dets)}
            )

        due = self._follow_ups.due(now, everything=final)
        await asyncio.gather(
            *(one_recovery(w, dets) for w, dets in groups.items()),
            *(follow_ups(w, dets) for w, dets in due.items()),
        )
        left = [det for det in pending if id(det) not in delivered]
        pending.clear()
        pending.extend(left)

    def probe_counts(self) -> tuple[int, int, int]:
        """Probes sent, failed, and rounds that could not probe (read at each scrape)."""
        return self.stats.probes, self.stats.probe_failures, self.stats.probe_errors

    def _running_on(self, node: str) -> list[Job]:
        """The watched jobs on ``node`` that its failure hit (every watched job: asked once
        per report): those RUNNING there, and those that ended abnormally there within
        ENDED_HIT. A node's Xid can reach the watcher after the job it killed was listed
        FAILED: that job's partition still sets the decision's mode."""
        now = datetime.now(UTC)
        return [
            w.job
            for w in self._jobs.values()
            if node in w.job.nodes
            and (
                w.job.state is JobState.RUNNING
                or (
                    w.job.state.is_abnormal_end
                    and (w.job.end_time is None or now - w.job.end_time <= ENDED_HIT)
                )
            )
        ]

    # ---------------------------------------------------------------- one job

    def _check_job(
        self, job: Job, nodes: dict[str, Node], wall: datetime, clock: float
    ) -> list[Detection]:
        watch = self._jobs.get(job.job_id)
        if (
            watch is not None
            and job.state is JobState.PENDING
            and watch.job.state is JobState.PENDING
            and job.restart_count == watch.restart_count
            and not watch.logs
            and not watch.node_since
        ):
            # Queued, unchanged, and never run while watched: no log, no node, nothing new. A
            # queue of 50,000 costs a lookup each here, not a pass of its own (3 s a listing).
            watch.job = job
            return []
        if watch is None:
            fresh = job.restart_count == 0 and LINEAGE_KEY not in job.comment_fields
            watch = self._jobs[job.job_id] = JobWatch(
                job, job.restart_count, fresh, self._tracker(job), submitted_at=job.submit_time
            )
        watch.job = job
        requeued = job.restart_count > watch.restart_count
        poll = Poll(self.config.cluster, job, watch, watch.restart_count, wall, clock)
        if requeued:
            text = f"requeued: restart count {poll.attempt} -> {job.restart_count}, now {job.state}"
            poll.add("job_state:REQUEUED", text=text)
            watch.restart_count, watch.progress = job.restart_count, self._tracker(job)
            watch.submitted_at = job.submit_time
            watch.drain_seen.clear()
        if job.state.is_abnormal_end:
            text = f"{job.state} exit_code={job.exit_code} reason={job.reason or '-'}"
            poll.add(f"job_state:{job.state}", text=text, fault_time=job.end_time)
        if job.state is JobState.RUNNING:
            self._node_states(poll, nodes)
        if job.state is not JobState.PENDING or watch.logs:  # none before it first runs
            self._job_logs(poll)
        self._node_news(poll)
        self._liveness.news(poll)
        if job.state is JobState.RUNNING and not requeued:
            self._progress(poll)
        return [d for d in poll.found if watch.first_time(d)]

    def _tracker(self, job: Job) -> ProgressTracker:
        """A tracker that follows at most the job's tasks (or the hard cap when unknown)."""
        ranks = job.num_tasks if job.num_tasks > 0 else MAX_RANKS
        return ProgressTracker(self.config.progress_pattern, k=self.config.stall_k, max_ranks=ranks)

    def _node_states(self, poll: Poll, nodes: dict[str, Node]) -> None:
        for name in poll.job.nodes:
            node = nodes.get(name)
            if node is None:
                continue
            drained_before = poll.watch.drain_seen.get(name)
            poll.watch.drain_seen[name] = node.drain_flag
            state: str | None = None
            if node.state is NodeState.DOWN:
                state = "DOWN"
            elif NodeFlag.NOT_RESPONDING in node.flags:
                state = "NOT_RESPONDING"
            elif NodeFlag.FAIL in node.flags:
                state = "FAIL"
            elif node.drain_flag and drained_before is False:
                # A drain that appeared while we watched; Relaunch's own drains are expected.
                state = None if node.reason.lower().startswith("relaunch") else "DRAIN"
            if state is not None:
                text = f"{name} {node.display_state} reason={node.reason or '-'}"
                poll.add(
                    f"node_state:{state}", nodes=[name], text=text, fault_time=node.reason_time
                )

    def _job_logs(self, poll: Poll) -> None:
        """Read and scan what the job's output files gained, within the job's budget for one
        pass (shared between its files): a job that writes faster than that is read over
        several passes, and the backlog is counted and said, never skipped. Read by need
        (watch_state.LogPace): a quiet log less often, an ended job's not at all."""
        job, watch, cfg = poll.job, poll.watch, self.config
        paths = [p for p in dict.fromkeys([job.stdout_path, job.stderr_path]) if p]
        share = max(1, cfg.max_job_bytes_per_pass // max(len(paths), 1))
        behind, writing = False, writes_output(job)
        for path in paths:
            stream = watch.logs.get(path)
            if stream is None:
                access = FileAccess.for_job(job, cfg.job_output)
                stream = watch.logs[path] = self._stream(
                    path, from_start=watch.from_start, access=access
                )
                stream.pace = LogPace(cfg.log_interval_s, cfg.log_quiet_max_s)
            if not stream.due(poll.clock, writing):
                continue
            lines = stream.read(share)
            stream.paced(poll.clock, writing)
            self.metrics.read(stream.last_read)
            self.metrics.file_ops(stream.last_ops)
            behind = behind or stream.behind
            ignored = watch.progress.ignored_lines
            for line in lines:
                if len(line.text) > MAX_LINE:
                    self.stats.long_lines += 1
                watch.progress.observe(line.text, poll.clock)
            self.stats.ignored_progress += watch.progress.ignored_lines - ignored
            for match in self._catalogue.scan_lines(lines, source=path):
                if match.role in REPORTED_ROLES:
                    poll.add_match(match, self._culprits(poll, match), DetectionSource.JOB_LOG)
        self._backlog(watch, behind)

    def _backlog(self, watch: JobWatch, behind: bool) -> None:
        """Count a pass that left the job's log unread, and say so when a backlog starts."""
        if not behind:
            watch.backlog_passes = 0
            return
        self.stats.backlogged += 1
        watch.backlog_passes += 1
        if watch.backlog_passes == 1:
            logger.warning(
                "job %s writes faster than its scanning budget; reading it over several passes",
                watch.job.job_id,
                extra={"job_id": watch.job.job_id, "budget": self.config.max_job_bytes_per_pass},
            )

    def _node_news(self, poll: Poll) -> None:
        """What the job's nodes' kernel logs, then their telemetry, gave in this pass that is
        news to this job: a node the job looks at for the first time gives nothing until the
        next pass (its log starts at the end, its telemetry is the GPUs' baseline)."""
        watch, news = poll.watch, []
        for stale in set(watch.node_since) - set(poll.job.nodes):
            del watch.node_since[stale]
        if poll.job.state is JobState.COMPLETED:
            # It ended well: a fault its old nodes report later is the next job's (or the
            # node's alone), never a reason to recover this one.
            return
        for node in poll.job.nodes:
            feed = self._feed(node)
            if watch.node_since.setdefault(node, self._pass) < self._pass:
                news.append((node, feed))
        for node, feed in news:
            for match in feed.matches:
                culprits = [node] if match.role is Role.ROOT else []
                poll.add_match(match, culprits, DetectionSource.NODE_LOG)
        for node, feed in news:
            for match in feed.telemetry_matches:
                poll.add_match(match, [node], DetectionSource.TELEMETRY)

    def _feed(self, node: str) -> NodeFeed:
        """The node's feed, read once in this pass: its new kernel-log lines matched against
        the catalogue, its new telemetry samples compared with each GPU's previous one."""
        feed = self._nodes.get(node)
        if feed is None:
            log_pattern, tel_pattern = self.config.node_log_pattern, self.config.telemetry_pattern
            feed = self._nodes[node] = NodeFeed(
                log=self._stream(log_pattern.replace("{node}", node), from_start=False)
                if log_pattern
                else None,
                telemetry=TelemetryTail(tel_pattern.replace("{node}", node))
                if tel_pattern
                else None,
            )
        if feed.read_in == self._pass:
            return feed
        first_read, feed.read_in = feed.read_in < 0, self._pass
        feed.matches, feed.telemetry_matches = [], []
        if feed.log is not None:
            lines = feed.log.read()
            self.metrics.read(feed.log.last_read)
            self.metrics.file_ops(feed.log.last_ops)
            feed.matches = [
                match
                for match in self._catalogue.scan_lines(
                    lines,
                    source=feed.log.tail.path,
                    source_node=node,
                    kernel=True,
                    record=feed.record,
                )
                if match.role in REPORTED_ROLES
            ]
            self._reports.kernel_log(node, feed.matches)
        if feed.telemetry is not None:
            samples = feed.telemetry.read()
            if first_read:
                # Read from the start once: what the agent said before is each GPU's baseline,
                # not news (the agent writes only on change, so the file stays small).
                feed.gpus.update({s.gpu: s for s in samples})
                return feed
            baseline = [feed.gpus[gpu] for gpu in {s.gpu for s in samples} if gpu in feed.gpus]
            for sample in samples:
                feed.gpus[sample.gpu] = sample
            feed.telemetry_matches = [
                finding.match
                for finding in telemetry_findings(baseline + samples, self._catalogue, [node])
                if finding.match.line_no > len(baseline) and finding.role is Role.ROOT
            ]
        return feed

    def _progress(self, poll: Poll) -> None:
        tracker, clock = poll.watch.progress, poll.clock
        floor, lag_floor = poll.watch.limits(self.config.hang_threshold_s, self.config.lag_floor_s)
        last, source = tracker.last_activity, DetectionSource.PROGRESS
        if last is not None and tracker.stalled(clock, floor):
            limit, step = tracker.stall_limit(floor), tracker.max_step
            text = (
                f"no rank advanced nor checkpoint finished for {clock - last:.0f}s "
                f"(step {step}, limit {limit:.0f}s)"
            )
            poll.add("hang", source=source, text=text, fault_time=poll.ago(clock - last))
            return
        ranks = tracker.ranks
        lagging = tracker.lagging_ranks(clock, lag_floor)
        lag_limit = tracker.lag_limit(lag_floor) if lagging else 0.0
        for rank in lagging:
            age = clock - ranks[rank].advanced_at
            node = poll.rank_node(rank)
            text = (
                f"rank {rank} stuck at step {ranks[rank].step} for {age:.0f}s; others advance "
                f"(limit {lag_limit:.0f}s)"
            )
            nodes = [node] if node else []
            kind = "progress_stalled_rank"
            poll.add(kind, source=source, nodes=nodes, text=text, fault_time=poll.ago(age))

    # ---------------------------------------------------------------- helpers

    def _stream(self, path: str, *, from_start: bool, access: FileAccess | None = None) -> Stream:
        size = self.config.max_read_bytes
        return Stream(
            FileTail(path, max_read=size, access=access)
            if from_start
            else FileTail.at_end(path, max_read=size, access=access)
        )

    def _culprits(self, poll: Poll, match: SignatureMatch) -> list[str]:
        if match.role is not Role.ROOT:
            return []
        culprit, allocated = self._catalogue.get(match.signature).culprit, poll.job.nodes
        if culprit is Culprit.RANK_PREFIX and match.rank is not None:
            node = poll.rank_node(match.rank)
            return [node] if node else []
        if culprit is Culprit.LINE_HOST and match.host:
            return normalise_host(match.host, allocated)  # the attribution engine's rule
        return []


def _fields(detection: Detection) -> dict[str, object]:
    keys = ("cluster", "job_id", "attempt", "kind", "nodes")
    return detection.model_dump(include=set(keys))
