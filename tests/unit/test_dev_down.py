"""`relaunch dev down` stops Relaunch's own services before it cancels the jobs: a watcher
still running while the jobs vanish would start recoveries for them."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path
from typing import Any

import psutil
import pytest

from relaunch.devstack import procs
from relaunch.devstack import stack as stack_module
from relaunch.devstack.stack import Stack, StackConfig


def test_down_stops_the_watcher_and_worker_before_it_cancels_jobs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    stack = Stack(tmp_path / "state", StackConfig(cluster="t", services=True))
    run = stack.state_dir / "run"
    run.mkdir(parents=True)
    services = {name: subprocess.Popen(["sleep", "60"]) for name in ("watch", "worker")}
    for name, proc in services.items():
        (run / f"{name}.pid").write_text(str(proc.pid))
    alive_when_cancelling: dict[str, bool] = {}

    def scancel_all(_: Any) -> None:
        for name, proc in services.items():
            alive_when_cancelling[name] = proc.poll() is None and procs.pid_alive(proc.pid)

    monkeypatch.setattr(stack_module, "scancel_all", scancel_all)
    monkeypatch.setattr(stack_module.services, "stop_postgres", lambda _: None)
    monkeypatch.setattr(stack_module.procs, "stack_processes", lambda *_: [])
    try:
        assert stack.down() == 2
    finally:
        for proc in services.values():
            proc.kill()
            proc.wait()
    assert alive_when_cancelling == {"watch": False, "worker": False}


def test_terminate_counts_a_process_that_vanishes_while_waited_for_as_gone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """psutil's pidfd wait raised the kernel's ENOENT for a process that had just gone (in
    `make bench`'s teardown): stopping the stack goes on and still stops everything."""
    child = subprocess.Popen(["sleep", "30"])

    def vanished(*args: object, **kwargs: object) -> None:
        raise FileNotFoundError(2, "No such file or directory")

    monkeypatch.setattr(procs.psutil, "wait_procs", vanished)
    assert procs.terminate([psutil.Process(child.pid)], grace=2.0) == 1
    assert child.wait(timeout=5) == -signal.SIGTERM
