"""The node agent's heartbeat file, written by ``relaunch agent`` and looked at by the watcher.

A beat replaces the small file ``heartbeat`` beside the agent's telemetry file with one JSON
object ``{"node", "time", "pid"}``: the telemetry file never grows with beats, and a reader
never sees half a beat. A clean stop removes the file (a stopped agent is not a dead node).
How the watcher judges a silent agent: ``relaunch.workers.watch_liveness``.
"""

from __future__ import annotations

import json
import os
from datetime import datetime
from pathlib import Path

HEARTBEAT_FILE = "heartbeat"
MAX_HEARTBEAT_BYTES = 4096  # the file is one small JSON object; more is not an agent's


def heartbeat_path(telemetry_path: str | os.PathLike[str]) -> Path:
    """Where the agent writing ``telemetry_path`` keeps its heartbeat: beside it."""
    return Path(telemetry_path).with_name(HEARTBEAT_FILE)


def write_heartbeat(path: Path, node: str, at: datetime) -> None:
    """Replace ``path`` with one JSON object ``{"node", "time", "pid"}``: written to a temporary
    file, then renamed over the old one, so a reader never sees half a beat and the file never
    grows."""
    path.parent.mkdir(parents=True, exist_ok=True)
    pid = os.getpid()
    body = json.dumps({"node": node, "time": at.isoformat(), "pid": pid}) + "\n"
    temporary = path.with_name(f".{path.name}.{pid}.tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    try:
        os.write(fd, body.encode())
    finally:
        os.close(fd)
    os.replace(temporary, path)


def remove_heartbeat(path: Path) -> None:
    """Remove this process's heartbeat file (a clean stop: the node is not dead), leaving
    another agent's alone."""
    try:
        with path.open("rb") as f:
            owner = json.loads(f.read(MAX_HEARTBEAT_BYTES)).get("pid")
    except (OSError, ValueError, AttributeError):
        return
    if owner == os.getpid():
        path.unlink(missing_ok=True)
