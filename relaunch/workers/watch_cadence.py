"""When the watcher lists jobs and nodes: a cost that follows what happens, not how many jobs
the queue holds.

A job listing (``squeue``) costs slurmctld one REQUEST_JOB_INFO that packs every job, and the
watcher the time to read it: 10 ms at 100 jobs, 0.7 s at 10,000, several seconds at 100,000.
Listing every second is a whole core at 10,000 jobs. What the listing alone tells is a job's
state (ended, requeued, started); the faults that need seconds are seen elsewhere: log lines
every ``log_interval_s``, dead slurmds by the probes, both independent of the listing. So:

- **Jobs**: the next full listing comes once the last one's wall time is at most
  ``listing_share`` of the time since it began (0.02: a 0.1 s listing every 5 s, a 0.7 s one
  every 35 s), never sooner than ``poll_interval_s`` and never later than ``reconcile_s`` (30 s)
  after it. A slow controller
  makes its own listings slower and so rarer: the watcher backs off from a busy slurmctld.
- **Active jobs**: between full listings, every ``active_interval_s`` (2 s), the jobs in any
  state but pending (``squeue --states=...``: only those printed and parsed, however long the
  queue): a job that starts is watched (its logs, its nodes' logs, probes) within seconds, one
  that ends is seen ending. A watched job that leaves that listing (requeued: pending again)
  makes the watcher busy, and the next full listing comes at the busy pace.
- **Busy**: a detection makes the watcher busy for ``busy_s``: the share is then
  ``listing_share_busy`` (0.25) and the active jobs are listed every ``poll_interval_s``, so
  that requeues, restarts and the next attempt's first lines are followed closely while a
  recovery runs, and the cost goes back down when it is over.
- **Nodes** (``sinfo``: cheap to read, two RPCs to slurmctld): every ``node_interval_s`` while
  watched jobs run, every ``poll_interval_s`` while busy or while a recovery waits to see its
  node drained. Each job listing lists the nodes with it.

:class:`Cadence` is the clock arithmetic only; relaunch/workers/watcher.py asks it what is due.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class CadenceSettings:
    poll_interval_s: float = 1.0  # the shortest time between two listings of a kind
    listing_share: float = 0.02
    listing_share_busy: float = 0.25
    reconcile_s: float = 30.0  # a job listing at least this often, however long it takes
    active_interval_s: float = 2.0
    node_interval_s: float = 5.0
    busy_s: float = 60.0


class Cadence:
    """What is due next, on a monotonic clock the caller passes in."""

    def __init__(self, settings: CadenceSettings) -> None:
        self.settings = settings
        self._jobs_began = -math.inf
        self._jobs_took = 0.0
        self._nodes_began = -math.inf
        self._active_began = -math.inf
        self._busy_until = -math.inf

    def busy(self, now: float) -> bool:
        return now < self._busy_until

    def stir(self, now: float) -> None:
        """Something happened (a detection): follow the cluster closely for ``busy_s``."""
        self._busy_until = now + self.settings.busy_s

    def job_interval(self, now: float) -> float:
        """Between the starts of two job listings, given what the last one took."""
        s = self.settings
        share = s.listing_share_busy if self.busy(now) else s.listing_share
        return min(s.reconcile_s, max(s.poll_interval_s, self._jobs_took / share))

    def node_interval(self, now: float, *, urgent: bool) -> float:
        s = self.settings
        if urgent or self.busy(now):
            return s.poll_interval_s
        return max(s.poll_interval_s, s.node_interval_s)

    def active_interval(self, now: float) -> float:
        s = self.settings
        return s.poll_interval_s if self.busy(now) else max(s.poll_interval_s, s.active_interval_s)

    def jobs_listed(self, began: float, took: float) -> None:
        """A full job listing began at ``began`` and took ``took`` seconds."""
        self._jobs_began, self._jobs_took = began, max(0.0, took)
        self._active_began = began

    def jobs_tried(self, began: float) -> None:
        """A full listing begins (its cost, once it succeeds: :meth:`jobs_listed`)."""
        self._jobs_began = self._active_began = began

    def active_listed(self, began: float) -> None:
        self._active_began = began

    def active_in(self, now: float) -> float:
        """Seconds until the next listing of the active jobs is due (0 or less: now)."""
        return self._active_began + self.active_interval(now) - now

    def nodes_listed(self, began: float) -> None:
        self._nodes_began = began

    def jobs_in(self, now: float) -> float:
        """Seconds until the next job listing is due (0 or less: now)."""
        return self._jobs_began + self.job_interval(now) - now

    def nodes_in(self, now: float, *, urgent: bool) -> float:
        """Seconds until the next node listing is due (0 or less: now)."""
        return self._nodes_began + self.node_interval(now, urgent=urgent) - now
