"""Process helpers for the dev stack: spawn detached, probe ports, and find every process that
belongs to one stack (by its state directory or its SLURM_CONF) so that `down` leaves none."""

from __future__ import annotations

import contextlib
import os
import random
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path

import psutil

from relaunch.models.errors import StackError

# Services of a stack listen here: below the kernel's ephemeral range (32768-60999 on Linux),
# where an outgoing connection of another process can take a port between the moment it is
# picked and the moment the service binds it ("Address already in use"), and below the DDP
# example's rendezvous ports (20000-31999).
SERVICE_PORTS = (10000, 19999)


def free_port() -> int:
    """A TCP port nothing listens on right now, from ``SERVICE_PORTS`` (for tests: one stack
    per session; a random pick, so that stacks started side by side rarely meet)."""
    low, high = SERVICE_PORTS
    for _ in range(500):
        port = random.randint(low, high)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:  # a crowded range: any port
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def port_open(port: int, host: str = "127.0.0.1", timeout: float = 0.3) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def pid_alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        proc = psutil.Process(pid)
        return bool(proc.status() != psutil.STATUS_ZOMBIE)
    except psutil.Error:
        return False


def read_pid(path: Path) -> int | None:
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def spawn(
    argv: Sequence[str], *, log: Path, env: Mapping[str, str] | None = None, cwd: Path | None = None
) -> int:
    """Start a long-running process detached from this one (its own session), output to ``log``."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
            cwd=cwd,
            start_new_session=True,
        )
    return proc.pid


def wait_for(
    predicate: Callable[[], bool],
    timeout: float,
    what: str,
    interval: float = 0.2,
    hint: str | None = None,
) -> None:
    """Poll ``predicate()`` until true; raise StackError naming ``what``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(interval)
    raise StackError(f"{what} not ready after {timeout:.0f}s", hint=hint)


def _protected() -> set[int]:
    """This process and its ancestors: never ours to kill."""
    pids = {os.getpid()}
    with contextlib.suppress(psutil.Error):
        pids.update(p.pid for p in psutil.Process().parents())
    return pids


def stack_processes(state_dir: Path, *slurm_confs: Path) -> list[psutil.Process]:
    """Every process that belongs to the stack under ``state_dir``: its daemons (their command
    line names a path inside it) and its jobs (their environment carries one of its clusters'
    SLURM_CONF)."""
    marker = str(state_dir.resolve())
    conf_envs = {f"SLURM_CONF={conf.resolve()}" for conf in slurm_confs}
    protected = _protected()
    found: list[psutil.Process] = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        if proc.pid in protected:
            continue
        try:
            cmdline = " ".join(proc.info["cmdline"] or [])
            if marker in cmdline:
                found.append(proc)
                continue
            with open(f"/proc/{proc.pid}/environ", "rb") as fh:
                environ = fh.read().decode(errors="replace").split("\0")
            if conf_envs.intersection(environ):
                found.append(proc)
        except (psutil.Error, OSError):
            continue
    return found


def terminate(procs: Iterable[psutil.Process], grace: float = 5.0) -> int:
    """SIGTERM, then SIGKILL whatever is left after ``grace`` seconds. Returns how many."""
    procs = list(procs)
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            proc.send_signal(signal.SIGTERM)
    alive = _wait(procs, grace)
    for proc in alive:
        with contextlib.suppress(psutil.Error):
            proc.kill()
    _wait(alive, grace)
    return len(procs)


def _wait(procs: list[psutil.Process], timeout: float) -> list[psutil.Process]:
    """``psutil.wait_procs``: the processes still alive after ``timeout``. A process that
    vanishes while it is waited for is gone (psutil's pidfd wait has raised the kernel's
    ENOENT for one, in `make bench`'s teardown), not an error."""
    try:
        return list(psutil.wait_procs(procs, timeout=timeout)[1])
    except OSError:
        deadline = time.monotonic() + timeout
        alive = [p for p in procs if _running(p)]
        while alive and time.monotonic() < deadline:
            time.sleep(0.1)
            alive = [p for p in alive if _running(p)]
        return alive


def _running(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False
