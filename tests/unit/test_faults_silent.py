"""Silent-fault tooling: freezing a node's processes, the partition's guard, the DDP example's
Megatron-style lines as Relaunch's progress rules read them, and the false-alarm run's pauses."""

from __future__ import annotations

import importlib.util
import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import ModuleType

import psutil
import pytest

from relaunch.detection.progress import (
    CHECKPOINT_PATTERN,
    MEGATRON_PROGRESS_PATTERN,
    RESUME_PATTERN,
)
from relaunch.devstack import faults
from relaunch.devstack.slurm import SlurmLayout

ROOT = Path(__file__).resolve().parents[2]
Procs = subprocess.Popen[bytes]
NodeProcs = tuple[SlurmLayout, Procs, Procs, Procs]


def layout(root: Path) -> SlurmLayout:
    return SlurmLayout(
        root=root,
        cluster="t",
        nodes=["n1", "n2"],
        slurmctld_port=1,
        slurmd_ports=[2, 3],
        restd_port=4,
        cred_expire=10,
    )


@pytest.fixture
def node_procs(tmp_path: Path) -> Iterator[NodeProcs]:
    lay = layout(tmp_path)
    daemon = subprocess.Popen(["sleep", "60"])
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "slurmd-n2.pid").write_text(f"{daemon.pid}\n")
    env = {**os.environ, "SLURM_CONF": str(lay.conf), "SLURMD_NODENAME": "n2", "SLURM_JOB_ID": "7"}
    rank = subprocess.Popen(["sleep", "60"], env=env)
    other = subprocess.Popen(["sleep", "60"], env={**env, "SLURM_JOB_ID": "8"})
    time.sleep(0.2)  # environ readable once exec'd
    try:
        yield lay, daemon, rank, other
    finally:
        for p in (daemon, rank, other):
            p.kill()
            p.wait(timeout=10)


def status_soon(pid: int, want: str, timeout: float = 5.0) -> str:
    """The process's status once it is ``want`` (a signal lands asynchronously), or the last."""
    deadline = time.monotonic() + timeout
    while (status := psutil.Process(pid).status()) != want and time.monotonic() < deadline:
        time.sleep(0.05)
    return status


def test_freeze_node_kills_slurmd_and_stops_only_the_jobs_processes(
    node_procs: NodeProcs,
) -> None:
    lay, daemon, rank, other = node_procs
    frozen = faults.freeze_node(lay, "n2", job_id="7")
    assert frozen == [rank.pid]
    assert daemon.wait(timeout=10) == -9
    assert status_soon(rank.pid, psutil.STATUS_STOPPED) == psutil.STATUS_STOPPED
    assert psutil.Process(other.pid).status() != psutil.STATUS_STOPPED
    assert faults.release_frozen(frozen) == 1
    assert rank.wait(timeout=10) == -9
    assert faults.release_frozen(frozen) == 0  # idempotent


@pytest.mark.parametrize("name", ["", "Bad", "x; flush ruleset", "a" * 60])
def test_partition_refuses_a_bad_table_name(tmp_path: Path, name: str) -> None:
    with pytest.raises(ValueError):
        faults.partition_ports(layout(tmp_path), "n2", [], table=name)
    with pytest.raises(ValueError):
        faults.heal_partition(name)


def load(path: Path, name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def test_megatron_lines_are_read_as_progress_checkpoint_and_resume(
    capsys: pytest.CaptureFixture[str],
) -> None:
    pytest.importorskip("torch")
    ddp = load(ROOT / "examples" / "train_ddp.py", "train_ddp_under_test")
    out = ddp.Printer("megatron", 1, "n2", 1_000_000)
    out.progress(231, 1.2345)
    out.saved(230, Path("/ck/ckpt-latest.pt"))
    out.resumed(230, Path("/ck"))
    progress, saved, loading, loaded = capsys.readouterr().out.splitlines()
    m = re.search(MEGATRON_PROGRESS_PATTERN, progress)
    assert m and m.group("step") == "231"
    assert re.match(r" \[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\] iteration      231/ 1000000 \|", progress)
    assert "| lm loss: 1.234500E+00 |" in progress
    assert "elapsed time per iteration (ms): " in progress
    c = CHECKPOINT_PATTERN.search(saved)
    assert c and "230" in c.groupdict().values()
    assert loading == " loading checkpoint from /ck at iteration 230"
    r = RESUME_PATTERN.search(loaded)
    assert r and "230" in r.groupdict().values()


def test_false_alarm_pauses_are_told_apart_by_kind() -> None:
    fa = load(ROOT / "bench" / "false_alarms.py", "false_alarms_under_test")
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    lines = []
    at = t0
    for step in range(1, 601):
        at += timedelta(seconds=0.2)
        lines.append((at, f"0: step={step} loss=0.5 rank=0 node=n1"))
        if step % 50 == 0:
            lines.append((at, f"0: checkpoint saved step={step} path=/x"))
            at += timedelta(seconds=20)
        if step % 120 == 0:
            lines.append((at, f"0: evaluation started step={step}"))
            at += timedelta(seconds=30)
    seen = fa.pauses(lines)
    assert seen["checkpoints_saved"] == 12
    assert seen["evaluations"] == 5
    assert seen["gaps"]["checkpoint"]["max_s"] == pytest.approx(20.2)
    assert seen["gaps"]["evaluation"]["max_s"] == pytest.approx(30.2)
    assert "checkpoint+evaluation" not in seen["gaps"]  # step 600 is the last: no step after it
    at_600 = next(t for t, line in lines if line.startswith("0: step=600 "))
    assert fa.pause_at(lines, at_600 + timedelta(seconds=47)) == (
        "step 600 printed 47 s before (checkpoint + evaluation)"
    )


ECHO = """
import socket, sys
srv = socket.socket(); srv.bind(("127.0.0.1", 0)); srv.listen()
print(srv.getsockname()[1], flush=True)
conn, _ = srv.accept()
while data := conn.recv(100):
    conn.sendall(data)
"""


def nft_usable() -> bool:
    if os.geteuid() != 0 or not Path("/usr/sbin/nft").exists():
        return False
    probe = subprocess.run(
        ["nft", "list", "tables"], capture_output=True, text=True, timeout=10, check=False
    )
    return probe.returncode == 0


@pytest.mark.skipif(not nft_usable(), reason="needs root and a working nft")
def test_partition_drops_packets_silently_and_heals(tmp_path: Path) -> None:

    echo = subprocess.Popen([sys.executable, "-c", ECHO], stdout=subprocess.PIPE, text=True)
    table = f"rltest_{os.getpid()}"
    try:
        assert echo.stdout is not None
        port = int(echo.stdout.readline())
        client = socket.create_connection(("127.0.0.1", port), timeout=5)
        client.sendall(b"a")
        assert client.recv(10) == b"a"
        part = faults.partition_ports(
            layout(tmp_path), "n2", [psutil.Process(echo.pid)], table=table
        )
        assert port in part.ports and 3 in part.ports  # the echo's port and n2's slurmd port
        client.settimeout(1.5)
        client.sendall(b"b")
        with pytest.raises(TimeoutError):  # dropped: no answer, no reset
            client.recv(10)
        with pytest.raises(TimeoutError):
            socket.create_connection(("127.0.0.1", port), timeout=1.5)
        assert faults.heal_partition(table)
        client.settimeout(30)
        assert client.recv(10) == b"b"  # TCP retransmits once the path is back
        client.close()
    finally:
        faults.heal_partition(table)
        echo.kill()
        echo.wait(timeout=10)
