"""Keep N copies of one command running: `relaunch worker --processes N`.

A Python Temporal worker is one asyncio event loop on one core. N worker processes polling the
cluster's task queue use N cores; Temporal spreads workflow and activity tasks over every poller
of a queue, so they share the work as workers on several hosts do.

The supervisor starts each child as a process of its own (``subprocess``, in a session of its
own), tells it which child it is by the environment (``RELAUNCH_WORKER_CHILD=i/N`` and the
supervisor's pid in ``RELAUNCH_WORKER_PARENT``), restarts a child that dies after a backoff, and
on SIGTERM or SIGINT forwards the signal to every child and waits until all have exited. It
imports nothing but the standard library, so it can be tested with any command as the child."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import FrameType

log = logging.getLogger("relaunch.worker.supervisor")

CHILD_ENV = "RELAUNCH_WORKER_CHILD"
PARENT_ENV = "RELAUNCH_WORKER_PARENT"
MAX_PROCESSES = 64
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


@dataclass(frozen=True)
class Backoff:
    """How long to wait before restarting a child that died: ``initial_s``, doubling after each
    death up to ``max_s``, and back to ``initial_s`` once the child had run ``reset_after_s``."""

    initial_s: float = 1.0
    max_s: float = 30.0
    reset_after_s: float = 60.0


@dataclass
class _Child:
    index: int
    delay_s: float
    proc: subprocess.Popen[bytes] | None = None
    started_at: float = 0.0
    restart_at: float = 0.0


def describe_exit(returncode: int) -> str:
    """How a child ended, from its return code (negative: the signal that killed it)."""
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"was killed by {name}"
    return f"exited with code {returncode}"


class Supervisor:
    """Runs ``count`` copies of ``argv`` until told to stop (see the module's docstring).

    ``env`` is the children's environment (default: this process's), to which the supervisor
    adds the child's label and its own pid. ``run`` must be called from the main thread, since it
    installs the SIGTERM and SIGINT handlers."""

    def __init__(
        self,
        argv: Sequence[str],
        count: int,
        *,
        env: Mapping[str, str] | None = None,
        backoff: Backoff | None = None,
        poll_s: float = 0.1,
        name: str = "worker",
    ) -> None:
        if not argv:
            raise ValueError("the supervisor needs a command to run")
        if not 1 <= count <= MAX_PROCESSES:
            raise ValueError(f"the number of processes must be 1 to {MAX_PROCESSES}, not {count}")
        self.argv = list(argv)
        self.count = count
        self.env = dict(os.environ if env is None else env)
        self.backoff = backoff or Backoff()
        self.poll_s = poll_s
        self.name = name
        self._children = [_Child(i, self.backoff.initial_s) for i in range(1, count + 1)]
        self._signals: list[int] = []

    def label(self, index: int) -> str:
        """The name of child ``index`` in log lines, e.g. ``worker[2/4]``."""
        return f"{self.name}[{index}/{self.count}]"

    def pids(self) -> list[int]:
        """The pids of the children running now."""
        return [c.proc.pid for c in self._children if c.proc is not None]

    def run(self) -> int:
        """Start the children, keep them running until SIGTERM or SIGINT, forward that signal to
        them and wait for every one to exit. Returns the process's exit code (0)."""
        previous = {sig: signal.signal(sig, self._on_signal) for sig in STOP_SIGNALS}
        try:
            log.info("starting %d %s processes", self.count, self.name)
            while not self._signals:
                self._tick(time.monotonic())
                if not self._signals:
                    time.sleep(self.poll_s)
            self._shut_down()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        log.info("all %s processes have exited", self.name)
        return 0

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self._signals.append(signum)

    def _tick(self, now: float) -> None:
        for child in self._children:
            if child.proc is None:
                if now >= child.restart_at:
                    self._start(child, now)
            elif (code := child.proc.poll()) is not None:
                self._died(child, code, now)

    def _start(self, child: _Child, now: float) -> None:
        env = {**self.env, CHILD_ENV: f"{child.index}/{self.count}", PARENT_ENV: str(os.getpid())}
        try:
            child.proc = subprocess.Popen(
                self.argv, env=env, stdin=subprocess.DEVNULL, start_new_session=True
            )
        except OSError as exc:
            delay = self._next_delay(child, ran_s=0.0)
            log.error(
                "%s could not be started (%s); trying again in %g s",
                self.label(child.index),
                exc,
                delay,
            )
            child.restart_at = now + delay
            return
        child.started_at = now
        log.info("started %s (pid %d)", self.label(child.index), child.proc.pid)

    def _died(self, child: _Child, code: int, now: float) -> None:
        assert child.proc is not None
        ran_s = now - child.started_at
        delay = self._next_delay(child, ran_s)
        log.error(
            "%s (pid %d) %s after %.1f s; restarting it in %g s",
            self.label(child.index),
            child.proc.pid,
            describe_exit(code),
            ran_s,
            delay,
        )
        child.proc = None
        child.restart_at = now + delay

    def _next_delay(self, child: _Child, ran_s: float) -> float:
        """The delay before this restart; doubles the next one."""
        if ran_s >= self.backoff.reset_after_s:
            child.delay_s = self.backoff.initial_s
        delay = child.delay_s
        child.delay_s = min(delay * 2, self.backoff.max_s)
        return delay

    def _shut_down(self) -> None:
        running = [c for c in self._children if c.proc is not None]
        names = ", ".join(signal.Signals(s).name for s in self._signals)
        log.info("%s: stopping %d %s processes", names, len(running), self.name)
        while running:
            while self._signals:
                signum = self._signals.pop(0)
                for child in running:
                    assert child.proc is not None
                    child.proc.send_signal(signum)  # a no-op once the child has been reaped
            for child in list(running):
                assert child.proc is not None
                if (code := child.proc.poll()) is not None:
                    log.info(
                        "%s (pid %d) %s",
                        self.label(child.index),
                        child.proc.pid,
                        describe_exit(code),
                    )
                    running.remove(child)
            if running:
                time.sleep(self.poll_s)


def child_index(env: Mapping[str, str] | None = None) -> tuple[int, int] | None:
    """``(i, N)`` when a supervisor started this process as its child ``i`` of ``N``."""
    value = (os.environ if env is None else env).get(CHILD_ENV, "")
    index, _, count = value.partition("/")
    if index.isdigit() and count.isdigit() and 1 <= int(index) <= int(count):
        return int(index), int(count)
    return None


def watch_parent(pid: int, *, interval_s: float = 1.0) -> threading.Thread:
    """In a child: send this process SIGTERM (a graceful shutdown) once its parent, ``pid``, is
    gone, so that a supervisor killed outright (SIGKILL) leaves no worker behind it."""

    def watch() -> None:
        while os.getppid() == pid:
            time.sleep(interval_s)
        log.warning("the supervisor (pid %d) is gone; stopping", pid)
        os.kill(os.getpid(), signal.SIGTERM)

    thread = threading.Thread(target=watch, name="watch-parent", daemon=True)
    thread.start()
    return thread
