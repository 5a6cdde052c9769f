"""Each node's health file for the job's own launcher: how Relaunch tells an in-job launcher to
leave a convicted node out of its next rendezvous (docs/spares.md).

NVIDIA's NVRx ``ft_launcher`` (v0.6.0 and later) checks, before every rendezvous join, the paths
given with ``--ft-storage-health-check-path`` ("Comma-separated list of absolute paths to
validate for existence and readability before rendezvous", nvidia_resiliency_ext
fault_tolerance/launcher.py; the probe, shared_utils/storage_probe.py, reads up to 4096 bytes of a
file in a subprocess with a 5 s limit). A path that is missing or unreadable makes the node
unhealthy: the launcher raises ``UnhealthyNodeException``, leaves the rendezvous, and a hot spare
takes its place. So the file here says "fit to train" by being there:

- ``<pattern with the node>`` (e.g. ``/shared/relaunch/health/n17``): present and readable while
  the node is in service. The watcher writes it for every node Slurm lists neither drained nor
  down (and a minute after a conviction, once the node is back in service); a job passes its
  own node's path: ``--ft-storage-health-check-path
  /shared/relaunch/health/$SLURMD_NODENAME``.
- Relaunch removes it the moment it convicts the node (before the drain), and writes
  ``<path>.unhealthy`` beside it: one JSON object saying which incident convicted the node, why,
  and when (for people, and for a node health service that counts failures).

Only Relaunch writes here: the directory is the service account's, never a job's.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path

from relaunch.connectors.files import write_atomic
from relaunch.models import names
from relaunch.models.scheduler import Node

FIT_TEXT = "fit: no fault known to Relaunch\n"
UNHEALTHY_SUFFIX = ".unhealthy"
# What the launcher's probe reads of a file before it calls it readable.
PROBE_BYTES = 4096
# How long a conviction keeps a node's file away although Slurm lists the node in service.
CONVICTION_HOLD_S = 60.0
# The watcher looks at one node's file at most this often (a stat per node, not per pass).
FIT_RECHECK_S = 30.0


class LauncherHealth:
    """The health files under ``pattern`` (a path with ``{node}``)."""

    def __init__(self, pattern: str) -> None:
        if "{node}" not in pattern or not os.path.isabs(pattern):
            raise ValueError(f"launcher_health_pattern {pattern!r}: an absolute path with {{node}}")
        self.pattern = pattern

    def path(self, node: str) -> Path:
        return Path(self.pattern.format(node=names.node_name(node)))

    def fit(self, node: str) -> bool:
        """Whether the launcher would find the node healthy: its file exists and reads."""
        try:
            with open(self.path(node), "rb") as fh:
                fh.read(PROBE_BYTES)
        except OSError:
            return False
        return True

    def mark_fit(self, node: str, *, now: float | None = None) -> bool:
        """Write the file of a node Slurm lists in service, unless it is there. A conviction
        younger than CONVICTION_HOLD_S keeps it away (the drain follows the conviction within
        seconds: a pass in between must not undo it); an older one, on a node back in service,
        is forgotten. True when the file was written now."""
        path = self.path(node)
        if path.exists():
            return False
        marker = path.with_name(path.name + UNHEALTHY_SUFFIX)
        try:
            age = (now if now is not None else time.time()) - marker.stat().st_mtime
        except FileNotFoundError:
            age = None
        if age is not None and age < CONVICTION_HOLD_S:
            return False
        write_atomic(path, FIT_TEXT, mode=0o644)
        marker.unlink(missing_ok=True)
        return True

    def flag(self, node: str, *, incident: str, reason: str) -> bool:
        """Take the node's file away (the launcher now finds it unhealthy) and say why in
        ``<path>.unhealthy``. Idempotent: True when the node was fit until now."""
        path = self.path(node)
        note = {
            "node": node,
            "incident": incident,
            "reason": reason[:500],
            "at": datetime.now(UTC).isoformat(),
        }
        marker = path.with_name(path.name + UNHEALTHY_SUFFIX)
        if not marker.exists():
            write_atomic(marker, json.dumps(note) + "\n", mode=0o644)
        try:
            path.unlink()
        except FileNotFoundError:
            return False
        return True


class FitFiles:
    """The watcher's side: the file of every node Slurm lists in service (neither drained nor
    down nor silent), looked at once per FIT_RECHECK_S per node."""

    def __init__(self, health: LauncherHealth) -> None:
        self.health = health
        self._looked: dict[str, float] = {}
        self.written = 0
        self.errors = 0

    def observe(self, nodes: Iterable[Node], now: float) -> None:
        """:meth:`due`, then :meth:`mark` them (blocking: the watcher runs it in a thread)."""
        self.mark(self.due(nodes, now))

    def due(self, nodes: Iterable[Node], now: float) -> list[str]:
        """The nodes in service whose file was not looked at in the last FIT_RECHECK_S (no
        I/O: counted as looked at from now)."""
        found = []
        for node in nodes:
            if node.drain_flag or not node.responding:
                continue
            if now - self._looked.get(node.name, -FIT_RECHECK_S) < FIT_RECHECK_S:
                continue
            self._looked[node.name] = now
            found.append(node.name)
        return found

    def mark(self, names: Iterable[str]) -> None:
        """Write the files of ``names`` that are missing (a stat each; a shared file system may
        be slow, so never on the watcher's event loop)."""
        for name in names:
            try:
                self.written += self.health.mark_fit(name)
            except (OSError, ValueError):  # a full disk, a name Slurm allows and paths do not
                self.errors += 1
