"""`relaunch dev up | status | down` bring up a real stack and take all of it down again."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import psycopg
import pytest
from temporalio.api.operatorservice.v1 import ListSearchAttributesRequest
from temporalio.client import Client

from relaunch.devstack.services import temporal_binary
from relaunch.devstack.stack import Stack, StackConfig
from relaunch.models.search_attributes import SEARCH_ATTRIBUTES
from tests.conftest import SLURM_RELEASE

RELAUNCH = [sys.executable, "-m", "relaunch.cli"]


def test_shell_tools_see_the_stack(stack: Stack, slurm_env: dict[str, str]) -> None:
    sinfo = subprocess.run(
        ["sinfo", "-N", "-h", "-o", "%N %t"],
        env=slurm_env,
        capture_output=True,
        text=True,
        check=True,
    )
    # Other tests have used this session's cluster; a fresh one is checked below.
    states = dict(line.split() for line in sinfo.stdout.splitlines())
    assert sorted(states) == [f"n{i}" for i in range(1, 5)]
    listed = subprocess.run(
        [str(temporal_binary()), "workflow", "list", "--address", stack.temporal_address],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert listed.returncode == 0, listed.stderr
    with psycopg.connect(stack.database_url) as conn:
        assert conn.execute("select 1").fetchone() == (1,)


async def test_search_attributes_registered(temporal_client: Client) -> None:
    response = await temporal_client.operator_service.list_search_attributes(
        ListSearchAttributesRequest(namespace="default")
    )
    for name in SEARCH_ATTRIBUTES:
        assert name in response.custom_attributes


def test_up_twice_changes_nothing(stack: Stack) -> None:
    before = {p.name: p.pid for p in stack.status().parts}
    status = stack.up()
    assert status.healthy
    assert {p.name: p.pid for p in status.parts} == before


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """A directory with a short path: slurmstepd's sockets live under the stack's spool
    directory, and a pytest-xdist tmp_path (``…/popen-gw1/test_cli_up_status_down_leave0/…``)
    pushes them past the 108-byte limit of a Unix socket path (the launch fails)."""
    path = Path(tempfile.mkdtemp(prefix="rl-up-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _stack_pids(state_dir: Path, conf: Path) -> list[str]:
    """Independent of the code under test: every process naming the state dir or its conf."""
    found = []
    for proc in psutil.process_iter(["pid", "name", "cmdline"]):
        try:
            cmd = " ".join(proc.info["cmdline"] or [])
            env = proc.environ() if proc.pid != os.getpid() else {}
        except psutil.Error:
            continue
        if str(state_dir) in cmd or env.get("SLURM_CONF") == str(conf):
            found.append(f"{proc.pid} {proc.info['name']}")
    return found


def test_cli_up_status_down_leaves_nothing_behind(short_tmp: Path) -> None:
    tmp_path = short_tmp
    state = tmp_path / "state"
    # Fix the ports through stack.json, as a first `up` would have.
    state.mkdir()
    config = StackConfig.with_free_ports(cluster="downtest", services=False, slurm=SLURM_RELEASE)
    (state / "stack.json").write_text(config.model_dump_json())
    up = subprocess.run(
        [*RELAUNCH, "dev", "up", "--state-dir", str(state), "--slurm", SLURM_RELEASE],
        capture_output=True,
        text=True,
        timeout=300,  # a first 24.11 stack on a fresh machine builds its Debian root
    )
    assert up.returncode == 0, up.stderr
    conf = state.resolve() / "slurm" / "slurm.conf"
    assert f"export SLURM_CONF={conf}" in up.stdout.splitlines()
    assert f"export TEMPORAL_ADDRESS=127.0.0.1:{config.temporal_port}" in up.stdout.splitlines()

    # The user's shell after the printed `export` lines: every Slurm command is the stack's
    # release (24.11's come from its Debian root, through the PATH printed first).
    env = dict(os.environ)
    for line in up.stdout.splitlines():
        if line.startswith("export "):
            name, _, value = line.removeprefix("export ").partition("=")
            env[name] = value.replace("$PATH", os.environ["PATH"])
    for command in ("sinfo", "squeue", "scontrol", "sbatch", "sacct"):
        version = subprocess.run(
            [command, "--version"], env=env, capture_output=True, text=True, check=True
        )
        # "slurm 22.05.8", "slurm-wlm 24.11.5"
        assert version.stdout.split()[-1].startswith(f"{SLURM_RELEASE}."), (command, version)
    sinfo = subprocess.run(
        ["sinfo", "-N", "-h", "-o", "%N %t"], env=env, capture_output=True, text=True, check=True
    )
    states = dict(line.split() for line in sinfo.stdout.splitlines())
    assert states == {f"n{i}": "idle" for i in range(1, 5)}

    status = subprocess.run(
        [*RELAUNCH, "dev", "status", "--state-dir", str(state)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert status.returncode == 0 and "DOWN" not in status.stdout, status.stdout
    assert "slurmd n4" in status.stdout and f"127.0.0.1:{config.temporal_port}" in status.stdout
    assert f"Slurm {SLURM_RELEASE} " in status.stdout, status.stdout

    # A running 2-node job whose processes record their pids.
    pids = tmp_path / "pids"
    pids.mkdir(mode=0o777)
    subprocess.run(
        [
            "sbatch",
            "-N",
            "2",
            f"--output={tmp_path}/job.out",
            f"--wrap=srun bash -c 'echo $$ > {pids}/$SLURMD_NODENAME; exec sleep 600'",
        ],
        env=env,
        check=True,
        capture_output=True,
        timeout=30,
    )
    # Generous: `make test` runs this beside another worker's stack on two cores.
    deadline = time.monotonic() + 180
    while len(list(pids.iterdir())) < 2:
        assert time.monotonic() < deadline, (
            "job did not start: "
            + subprocess.run(
                ["squeue", "-o", "%i %T %r %N"], env=env, capture_output=True, text=True, timeout=30
            ).stdout
        )
        time.sleep(0.3)
    job_pids = [int(p.read_text()) for p in pids.iterdir()]
    assert all(psutil.pid_exists(p) for p in job_pids)

    down = subprocess.run(
        [*RELAUNCH, "dev", "down", "--state-dir", str(state)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert down.returncode == 0, down.stderr
    assert not [p for p in job_pids if psutil.pid_exists(p)]
    assert _stack_pids(state.resolve(), conf) == []
    after = subprocess.run(
        [*RELAUNCH, "dev", "status", "--state-dir", str(state)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert after.returncode == 1 and "DOWN" in after.stdout
