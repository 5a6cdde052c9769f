"""The watcher's signs that a node is gone although nothing was printed: slurmd probes and the
node agents' heartbeats.

- A node that dies silently prints nothing, and Slurm takes ~100 s to call it NOT_RESPONDING.
  So, with a :class:`LivenessMonitor`, every node a RUNNING watched job runs on (one target per
  node, however many jobs share it; not those Slurm lists DOWN) has its slurmd probed every
  ``probe_interval_s`` beside the polling; ``probe_failures`` failures in a row make a trusted
  ``node_unreachable`` detection (source ``probe``) for each RUNNING job on the node, unless
  the node is alive all the same (relaunch/detection/liveness.py: any job can fill a slurmd's
  listen backlog): its kernel reset the SYN probe's ACK (a full listen queue), or a connect
  probe timed out while Slurm's listing shows its slurmd responding or its agent beats. Such a
  streak is logged once and counted (``probe_alive``), not reported.
- A node agent (``relaunch agent --heartbeat`` with ``--output DIR/telemetry.jsonl``) replaces
  the small file ``DIR/heartbeat`` at every beat; the telemetry file never grows with beats.
  Once per poll the watcher looks at each running node's heartbeat file: a changed (inode,
  mtime, size) is a beat seen *now*, by the watcher's own clock, so a skewed node clock cannot
  fake one. A node whose agent was heard and then is silent for ``heartbeat_timeout_s`` is
  reported as ``heartbeat_lost`` (source ``telemetry``): it also sees a frozen node whose kernel
  still answers probes. At first sight a file older than the timeout (its mtime against the
  watcher's clock: the only time the file's own time is trusted) means no agent runs, not a
  dead node: not a source until it changes. A file that goes away is an agent that stopped
  cleanly (it removes its file): no longer a source. When at least half the agents (three or
  more) fall silent in the same poll, that is the shared file system they write to, not the
  nodes: nothing is reported (the probes still watch those nodes).
- A node where a rank of the job advanced after the failure began (and recently) is evidently
  running that job, whatever the probes or the agent say (slurmd restarting for an upgrade, an
  agent killed by the OOM killer): neither sign is reported for that job then. Job output only
  ever holds a detection back here, never makes one: a job that prints fake progress can only
  delay its own recovery, and its hang and lag limits still apply.
- Per-pass costs stay dict reads: the unreachable set is taken once per pass and the heartbeat
  files are looked at once per poll; each job then looks its nodes up.
"""

from __future__ import annotations

import json
import logging
import math
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from relaunch.connectors.liveness import MAX_TARGETS, LivenessMonitor, NodeLiveness, ProbeTarget
from relaunch.connectors.telemetry.heartbeat import MAX_HEARTBEAT_BYTES, heartbeat_path
from relaunch.detection.liveness import alive_despite_probe
from relaunch.models.errors import InvalidNameError
from relaunch.models.recovery import DetectionSource
from relaunch.models.scheduler import Job, JobState, Node, NodeState
from relaunch.workers.watch_state import Poll, WatchStats

logger = logging.getLogger("relaunch.workers.watcher")

# This many agents (and at least half of them) silent in one poll: the file system, not nodes.
MASS_SILENCE_NODES = 3


@dataclass
class Heartbeat:
    """One node agent's heartbeat file as the watcher follows it. ``seen`` is the watcher's
    wall time of the last beat, None while the agent is not a source; ``written`` is the file's
    mtime at that beat (the fault time when it is plausible)."""

    node: str
    path: Path
    key: tuple[int, int, int] | None = None  # (inode, mtime_ns, size) at the last look
    seen: datetime | None = None
    written: datetime | None = None
    blind: bool = False  # the last look failed: the watcher's trouble, not the node's silence
    other_node: bool = False

    def look(self, wall: datetime, timeout_s: float) -> None:
        """Look at the file once and note a beat (see the module docstring)."""
        try:
            with self.path.open("rb") as f:
                # Opened, not only stat'ed: on NFS an open revalidates the name, a stat may
                # answer from a cache for seconds.
                st = os.fstat(f.fileno())
                data = f.read(MAX_HEARTBEAT_BYTES)
        except FileNotFoundError:
            self.key = self.seen = self.written = None
            self.blind = False
            return
        except OSError as exc:
            if not self.blind:
                logger.warning(
                    "cannot read heartbeat file", extra={"path": str(self.path), "error": str(exc)}
                )
            self.blind = True
            return
        if self._names_another_node(data):
            self.key = self.seen = self.written = None
            return
        key = (st.st_ino, st.st_mtime_ns, st.st_size)
        written = datetime.fromtimestamp(st.st_mtime_ns / 1e9, UTC)
        first, changed, was_blind = self.key is None, key != self.key, self.blind
        self.key, self.blind = key, False
        if first and (wall - written).total_seconds() > timeout_s:
            return  # an agent that stopped long ago: not a source until it beats again
        if changed:
            self.seen, self.written = wall, written
        elif was_blind and self.seen is not None:
            self.seen = wall  # the time the watcher could not look is not the agent's silence

    def lost(self, wall: datetime, timeout_s: float) -> datetime | None:
        """When the agent was last heard from, if that is more than ``timeout_s`` ago."""
        seen = self.seen
        if seen is None or self.blind or (wall - seen).total_seconds() <= timeout_s:
            return None
        written = self.written
        plausible = written is not None and 0 <= (seen - written).total_seconds() <= timeout_s
        return written if plausible and written is not None else seen

    def _names_another_node(self, data: bytes) -> bool:
        try:
            named = json.loads(data).get("node")
        except (ValueError, AttributeError):
            return False  # not ours to judge: the change still counts as a beat
        other = isinstance(named, str) and named.split(".")[0] != self.node
        if other and not self.other_node:
            logger.warning(
                "heartbeat file of node %s names node %s; ignored",
                self.node,
                named,
                extra={"path": str(self.path)},
            )
        self.other_node = other
        return other


class Liveness:
    """The probes and heartbeats of the nodes RUNNING watched jobs run on, for one watcher:
    :meth:`update` once per poll, :meth:`refresh` once per log pass, :meth:`news` per job."""

    def __init__(
        self,
        monitor: LivenessMonitor | None,
        stats: WatchStats,
        *,
        telemetry_pattern: str | None,
        heartbeat_timeout_s: float,
        hang_floor_s: float,
        lag_floor_s: float,
    ) -> None:
        self.monitor = monitor
        self.stats = stats
        self._telemetry_pattern = telemetry_pattern
        self._timeout_s = heartbeat_timeout_s
        self._floors = (hang_floor_s, lag_floor_s)
        self._targets: dict[str, ProbeTarget] = {}
        self._unreachable: dict[str, NodeLiveness] = {}
        self._nodes: dict[str, Node] = {}  # Slurm's view of the nodes at the last poll
        self._alive_said: dict[str, datetime | None] = {}  # node -> the streak said alive
        self._wall: datetime | None = None  # the last poll's wall time
        self._bad_targets: set[str] = set()
        self._capped_said = False
        self._beats: dict[str, Heartbeat] = {}
        self._silent: dict[str, datetime] = {}
        self._mass_silence_said = False

    def update(self, jobs: Iterable[Job], nodes: dict[str, Node], wall: datetime) -> None:
        """Once per poll: tell the monitor which nodes to probe, look at the running nodes'
        heartbeat files, and take both verdicts (and the counters) for the passes to come."""
        running = [job for job in jobs if job.state is JobState.RUNNING]
        self._look(running, wall)
        self._wall = wall
        self._probe(running, nodes)

    def refresh(self) -> None:
        """Once per log pass: the monitor's verdicts (a dict read)."""
        self._unreachable = self._convicted(self.monitor.unreachable()) if self.monitor else {}

    def news(self, poll: Poll) -> None:
        """A detection for each of a RUNNING job's nodes that the probes call unreachable or
        whose agent fell silent, unless a rank of the job there says otherwise."""
        if poll.job.state is not JobState.RUNNING:
            return
        suspects = [n for n in poll.job.nodes if n in self._unreachable or n in self._silent]
        if not suspects:
            return
        vouched = self._vouched(poll)
        for node in suspects:
            down = self._unreachable.get(node)
            if down is not None and not vouched(node, down.failing_since):
                poll.add(
                    "node_unreachable",
                    source=DetectionSource.PROBE,
                    nodes=[node],
                    text=self._unreachable_text(node, down),
                    fault_time=down.failing_since,
                )
            last = self._silent.get(node)
            if last is not None and not vouched(node, last):
                silent = (poll.wall - last).total_seconds()
                text = (
                    f"{node}: no agent heartbeat for {silent:.0f}s (last {last:%H:%M:%S}, "
                    f"limit {self._timeout_s:g}s)"
                )
                poll.add(
                    "heartbeat_lost",
                    source=DetectionSource.TELEMETRY,
                    nodes=[node],
                    text=text,
                    fault_time=last,
                )

    # ---------------------------------------------------------------- probes

    def _probe(self, running: list[Job], nodes: dict[str, Node]) -> None:
        """Probe the nodes with an address and a port, not listed DOWN by Slurm (it already
        knows), at most one monitor's worth."""
        monitor = self.monitor
        if monitor is None:
            return
        targets: dict[str, ProbeTarget] = {}
        capped = False
        for job in running:
            for name in job.nodes:
                node = nodes.get(name)
                if name in targets or node is None or not node.address or node.port <= 0:
                    continue
                if node.state is NodeState.DOWN:
                    continue
                if len(targets) >= MAX_TARGETS:
                    capped = True
                    continue
                target = self._target(name, node)
                if target is not None:
                    targets[name] = target
        if capped and not self._capped_said:
            self._capped_said = True  # once: it would otherwise be said at every poll
            logger.warning(
                "probing only %d of the watched nodes (one monitor's limit)", MAX_TARGETS
            )
        monitor.watch(targets.values())
        self._targets = targets
        self._nodes = nodes
        self._unreachable = self._convicted(monitor.unreachable())
        stats = self.stats
        stats.probes, stats.probe_failures = monitor.stats.probes, monitor.stats.failed
        stats.probe_errors = monitor.stats.errors
        stats.probed_nodes, stats.unreachable_nodes = len(targets), len(self._unreachable)

    def _convicted(self, unreachable: dict[str, NodeLiveness]) -> dict[str, NodeLiveness]:
        """The unreachable nodes the probes convict: not those alive all the same by
        ``alive_despite_probe`` (a full listen queue, or a timeout while Slurm's last listing
        shows their slurmd responding or their agent still beats). Each such streak is said
        once."""
        out: dict[str, NodeLiveness] = {}
        for node, down in unreachable.items():
            why = alive_despite_probe(
                down.detail, self._nodes.get(node), heartbeat_fresh=self._beating(node)
            )
            if why is None:
                out[node] = down
                continue
            if node not in self._alive_said or self._alive_said[node] != down.failing_since:
                self._alive_said[node] = down.failing_since
                self.stats.probe_alive += 1
                logger.warning(
                    "%s: not reported, alive: %s; probes: %s",
                    node,
                    why,
                    self._unreachable_text(node, down),
                )
        for node in set(self._alive_said) - set(unreachable):
            del self._alive_said[node]
        return out

    def _beating(self, node: str) -> bool:
        """Whether the node's agent beat within the heartbeat timeout (the watcher's clock)."""
        beat, wall = self._beats.get(node), self._wall
        if beat is None or beat.seen is None or beat.blind or wall is None:
            return False
        return (wall - beat.seen).total_seconds() <= self._timeout_s

    def _target(self, name: str, node: Node) -> ProbeTarget | None:
        target = self._targets.get(name)
        if target is not None and (target.address, target.port) == (node.address, node.port):
            return target
        try:
            return ProbeTarget(name, node.address, node.port)
        except InvalidNameError as exc:
            if name not in self._bad_targets:
                self._bad_targets.add(name)
                logger.warning("not probing node %s: %s", name, exc.message)
            return None

    def _unreachable_text(self, node: str, down: NodeLiveness) -> str:
        target = self._targets.get(node)
        where = f" {target.address}:{target.port}" if target else ""
        since = f" since {down.failing_since:%H:%M:%S}" if down.failing_since else ""
        return (
            f"{node} slurmd{where}: {down.detail or 'failed'} ×{down.failures}{since} "
            f"({self._probe_method()} probe)"
        )

    def _probe_method(self) -> str:
        if self.monitor is None:
            return ""
        prober = self.monitor.prober
        used = getattr(prober, "last_method", "")  # RemoteProber: syn or connect, over SSH
        return f"{prober.method}/{used}" if used else prober.method

    # ---------------------------------------------------------------- heartbeats

    def _look(self, running: list[Job], wall: datetime) -> None:
        pattern = self._telemetry_pattern
        if pattern is None:
            return
        names = {name for job in running for name in job.nodes}
        for gone in set(self._beats) - names:
            del self._beats[gone]
        self._silent = {}
        for name in names:
            beat = self._beats.get(name)
            if beat is None:
                path = heartbeat_path(pattern.replace("{node}", name))
                beat = self._beats[name] = Heartbeat(name, path)
            beat.look(wall, self._timeout_s)
            last = beat.lost(wall, self._timeout_s)
            if last is not None:
                self._silent[name] = last
        sources = sum(b.seen is not None for b in self._beats.values())
        self.stats.heartbeat_nodes = sources
        together = len(self._silent)
        if together >= MASS_SILENCE_NODES and together * 2 >= sources:
            # Half the agents falling silent in the same poll is the file system they write to
            # (or the watcher's view of it), not half the fleet: a rack that really lost power
            # is seen by the probes, which still watch these nodes.
            if not self._mass_silence_said:
                logger.warning(
                    "heartbeat files of %d of %d nodes went stale together: not reported "
                    "(a shared file system stall?); the slurmd probes still watch them",
                    together,
                    sources,
                )
            self._mass_silence_said = True
            self._silent = {}
        elif not together:
            self._mass_silence_said = False

    # ---------------------------------------------------------------- the job's own word

    def _vouched(self, poll: Poll) -> Callable[[str, datetime | None], bool]:
        """Whether a rank of the job that runs on a node advanced after a given time, and no
        longer ago than the job's lag limit (a rank that stopped since no longer vouches for
        its node). One pass over the job's ranks, however many of its nodes are suspect. Only
        ever holds a detection back (see the module docstring)."""
        tracker = poll.watch.progress
        _, lag_floor = poll.watch.limits(*self._floors)
        recent = tracker.lag_limit(lag_floor)
        latest: dict[str, float] = {}  # node -> its ranks' latest advance (the tracker's clock)
        for rank, progress in tracker.ranks.items():
            if rank is None or poll.clock - progress.advanced_at > recent:
                continue
            node = poll.rank_node(rank)
            if node is not None and progress.advanced_at > latest.get(node, -math.inf):
                latest[node] = progress.advanced_at

        def vouched(node: str, since: datetime | None) -> bool:
            advanced = latest.get(node)
            return (
                since is not None
                and advanced is not None
                and poll.ago(poll.clock - advanced) > since
            )

        return vouched
