"""`relaunch worker --processes N`: the supervisor keeps N children running, restarts one that
dies and forwards SIGTERM/SIGINT to them all; the CLI validates N and starts children that run
`relaunch worker --processes 1`.

The supervisor runs in a process of its own (it installs signal handlers) with a tiny Python
script as the child, so no Temporal server is needed."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from relaunch.cli import cli, incidents
from relaunch.workers import supervisor as sup

# A child: records "up-<pid>" (its label) once its handlers are in place, "stop-<pid>" (the
# signal's name) when SIGTERM or SIGINT arrives, and exits on its own after 30 s at the latest.
CHILD = """
import os, signal, sys, time
from pathlib import Path

out, me = Path(sys.argv[1]), os.getpid()

def record(name, text):
    (out / f".{name}").write_text(text)
    (out / f".{name}").rename(out / name)

def stop(signum, frame):
    record(f"stop-{me}", signal.Signals(signum).name)
    sys.exit(0)

signal.signal(signal.SIGTERM, stop)
signal.signal(signal.SIGINT, stop)
if sys.argv[2:] == ["watch"]:
    from relaunch.workers.supervisor import watch_parent
    watch_parent(os.getppid(), interval_s=0.05)
child, parent = (os.environ.get(f"RELAUNCH_WORKER_{k}", "") for k in ("CHILD", "PARENT"))
record(f"up-{me}", f"{child} {parent}")
deadline = time.monotonic() + 30
while time.monotonic() < deadline:
    time.sleep(0.05)
"""

# The supervisor, as `relaunch worker --processes N` runs it, with CHILD as the command.
SUPERVISOR = """
import logging, sys
from relaunch.workers.supervisor import Backoff, Supervisor

logging.basicConfig(level=logging.INFO, format="%(message)s")
argv = [sys.executable, sys.argv[1], sys.argv[2]]
backoff = Backoff(initial_s=0.05, max_s=0.2)
sys.exit(Supervisor(argv, int(sys.argv[3]), backoff=backoff, poll_s=0.02).run())
"""


def wait_for(what: str, check: Callable[[], Any], timeout: float = 5.0) -> Any:
    """Poll ``check`` until it returns something true; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if result := check():
            return result
        time.sleep(0.02)
    pytest.fail(f"timed out waiting for {what}")


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


class Rig:
    """A supervisor process with CHILD as its children; records under ``out``."""

    def __init__(self, tmp: Path, count: int) -> None:
        self.out = tmp / "out"
        self.out.mkdir()
        child, script = tmp / "child.py", tmp / "supervisor.py"
        child.write_text(CHILD)
        script.write_text(SUPERVISOR)
        self.log = tmp / "supervisor.log"
        with self.log.open("wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, str(script), str(child), str(self.out), str(count)],
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
            )

    def records(self, kind: str) -> dict[int, str]:
        """pid -> text of every ``kind`` record (up, stop) written so far."""
        return {
            int(p.name.split("-")[1]): p.read_text()
            for p in self.out.glob(f"{kind}-*")
            if not p.name.startswith(".")
        }

    def up(self, count: int) -> dict[int, str]:
        """Wait until ``count`` children have ever started; pid -> label."""
        return wait_for(
            f"{count} children", lambda: (ups := self.records("up")) and len(ups) >= count and ups
        )

    def text(self) -> str:
        return self.log.read_text()

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=5)
        for pid in self.records("up"):
            if alive(pid) and pid not in self.records("stop"):
                os.kill(pid, signal.SIGKILL)


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Callable[[int], Rig]]:
    rigs: list[Rig] = []

    def make(count: int) -> Rig:
        rigs.append(Rig(tmp_path, count))
        return rigs[-1]

    yield make
    for r in rigs:
        r.close()


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGINT])
def test_starts_n_children_and_forwards_the_stop_signal_to_them_all(
    rig: Callable[[int], Rig], stop: signal.Signals
) -> None:
    r = rig(3)
    ups = r.up(3)
    assert sorted(label.split()[0] for label in ups.values()) == ["1/3", "2/3", "3/3"]
    assert {label.split()[1] for label in ups.values()} == {str(r.proc.pid)}
    for pid in ups:
        assert os.getpgid(pid) == pid, "each child leads a session of its own"
    r.proc.send_signal(stop)
    assert r.proc.wait(timeout=5) == 0
    assert r.records("stop") == dict.fromkeys(ups, stop.name)
    assert not any(alive(pid) for pid in ups)
    assert f"{stop.name}: stopping 3 worker processes" in r.text()
    for index in (1, 2, 3):
        assert re.search(rf"worker\[{index}/3\] \(pid \d+\) exited with code 0", r.text())
    assert len(r.records("up")) == 3, "no child was restarted while stopping"


def test_a_killed_child_is_restarted_and_the_log_says_so(rig: Callable[[int], Rig]) -> None:
    r = rig(2)
    ups = r.up(2)
    victim = next(pid for pid, label in ups.items() if label.startswith("2/2"))
    os.kill(victim, signal.SIGKILL)
    after = r.up(3)
    (replacement,) = set(after) - set(ups)
    assert after[replacement].startswith("2/2 ")
    assert re.search(
        rf"worker\[2/2\] \(pid {victim}\) was killed by SIGKILL after [\d.]+ s; "
        r"restarting it in 0.05 s",
        r.text(),
    )
    # Killed again within the reset time, it is restarted after twice the delay.
    os.kill(replacement, signal.SIGKILL)
    r.up(4)
    assert "restarting it in 0.1 s" in r.text()
    r.proc.terminate()
    assert r.proc.wait(timeout=5) == 0
    running = {pid for pid in r.records("up") if pid not in (victim, replacement)}
    assert set(r.records("stop")) == running


def test_backoff_doubles_to_its_maximum_and_resets_after_a_long_run() -> None:
    s = sup.Supervisor(["true"], 1, backoff=sup.Backoff(initial_s=1, max_s=30, reset_after_s=60))
    child = s._children[0]
    delays = [s._next_delay(child, ran_s=2) for _ in range(7)]
    assert delays == [1, 2, 4, 8, 16, 30, 30]
    assert s._next_delay(child, ran_s=60) == 1
    assert s._next_delay(child, ran_s=5) == 2


def test_describe_exit_names_the_signal_or_the_code() -> None:
    assert sup.describe_exit(-9) == "was killed by SIGKILL"
    assert sup.describe_exit(3) == "exited with code 3"
    assert sup.describe_exit(-200) == "was killed by signal 200"


@pytest.mark.parametrize("count", [0, 65])
def test_the_supervisor_refuses_a_count_out_of_range(count: int) -> None:
    with pytest.raises(ValueError, match="1 to 64"):
        sup.Supervisor(["true"], count)


def test_a_child_stops_when_its_supervisor_is_killed(tmp_path: Path) -> None:
    (tmp_path / "child.py").write_text(CHILD)
    out = tmp_path / "out"
    out.mkdir()
    middle = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import subprocess, sys, time; subprocess.Popen(sys.argv[1:]); time.sleep(30)",
            sys.executable,
            str(tmp_path / "child.py"),
            str(out),
            "watch",
        ],
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
    )
    try:
        (pid,) = wait_for("the child", lambda: list(out.glob("up-*")))
        middle.kill()
        middle.wait(timeout=5)
        stopped = out / f"stop-{pid.name.split('-')[1]}"
        assert wait_for("the child to stop", stopped.exists)
        assert stopped.read_text() == "SIGTERM"
    finally:
        if middle.poll() is None:
            middle.kill()
            middle.wait(timeout=5)


# ---------------------------------------------------------------------- CLI


@pytest.mark.parametrize(
    ("args", "env", "message"),
    [
        (["--processes", "0"], {}, "0 is not in the range 1<=x<=64"),
        (["--processes", "65"], {}, "65 is not in the range 1<=x<=64"),
        ([], {"RELAUNCH_WORKER_PROCESSES": "0"}, "0 is not in the range 1<=x<=64"),
        ([], {"RELAUNCH_WORKER_PROCESSES": "four"}, "'four' is not a valid integer"),
    ],
)
def test_the_cli_refuses_a_bad_number_of_processes(
    args: list[str], env: dict[str, str], message: str
) -> None:
    result = CliRunner().invoke(cli, ["worker", *args], env=env)
    assert result.exit_code == 2
    assert "Invalid value for '--processes'" in result.output and message in result.output
    assert "Traceback" not in result.output


def _config(tmp_path: Path) -> Path:
    path = tmp_path / "cluster.json"
    path.write_text(
        json.dumps({"name": "c", "database_url": "postgresql://db/x", "bundle_dir": "/tmp/b"})
    )
    return path


class FakeSupervisor:
    made: list[FakeSupervisor] = []

    def __init__(self, argv: list[str], count: int, *, env: dict[str, str]) -> None:
        self.argv, self.count, self.env = argv, count, env
        FakeSupervisor.made.append(self)

    def run(self) -> int:
        return 0


def test_the_cli_supervises_children_that_run_one_worker_each(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sup, "Supervisor", FakeSupervisor)
    monkeypatch.setattr(incidents, "_logging", lambda *args: None)
    FakeSupervisor.made.clear()
    config = _config(tmp_path)
    result = CliRunner().invoke(
        cli, ["worker", "--config", str(config)], env={"RELAUNCH_WORKER_PROCESSES": "4"}
    )
    assert result.exit_code == 0, result.output
    (made,) = FakeSupervisor.made
    assert made.count == 4
    assert made.argv[:4] == [sys.executable, "-m", "relaunch.cli", "worker"]
    assert made.argv[made.argv.index("--config") + 1] == str(config.resolve())
    assert made.argv[-2:] == ["--processes", "1"]
    assert made.env["RELAUNCH_WORKER_PROCESSES"] == "1"


def test_the_cli_checks_the_configuration_before_starting_children(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sup, "Supervisor", FakeSupervisor)
    FakeSupervisor.made.clear()
    missing = tmp_path / "nope.json"
    result = CliRunner().invoke(cli, ["worker", "--processes", "3", "--config", str(missing)])
    assert result.exit_code == 1
    assert result.output.startswith("error: no configuration for cluster 'dev'")
    assert not FakeSupervisor.made


def test_one_process_runs_the_worker_here_labelled_when_a_supervisor_started_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from relaunch.workers import worker

    ran: list[str] = []
    labels: list[str | None] = []
    watched: list[int] = []

    async def fake_run_worker(config: Any) -> None:
        ran.append(config.name)

    monkeypatch.setattr(worker, "run_worker", fake_run_worker)
    monkeypatch.setattr(incidents, "_logging", lambda label, *log: labels.append(label))
    monkeypatch.setattr(sup, "watch_parent", watched.append)
    monkeypatch.setattr(sup, "Supervisor", FakeSupervisor)
    FakeSupervisor.made.clear()
    config = _config(tmp_path)
    result = CliRunner().invoke(cli, ["worker", "--config", str(config)])
    assert result.exit_code == 0, result.output
    assert (ran, labels, watched) == (["c"], [None], [])
    env = {"RELAUNCH_WORKER_CHILD": "2/4", "RELAUNCH_WORKER_PARENT": "4242"}
    result = CliRunner().invoke(cli, ["worker", "--config", str(config)], env=env)
    assert result.exit_code == 0, result.output
    assert (ran, labels, watched) == (["c", "c"], [None, "worker[2/4]"], [4242])
    assert not FakeSupervisor.made
