"""Bad input and a dead controller give one clear line and a non-zero exit, never a traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from relaunch.devstack import procs
from relaunch.devstack.stack import Stack

RELAUNCH = [sys.executable, "-m", "relaunch.cli"]


def relaunch(
    stack: Stack, *args: str, conf: Path | None = None
) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **stack.slurm_env, "SLURM_CONF": str(conf or stack.slurm.conf)}
    return subprocess.run([*RELAUNCH, *args], env=env, capture_output=True, text=True, timeout=60)


def assert_one_line_error(result: subprocess.CompletedProcess[str], *words: str) -> None:
    assert result.returncode != 0
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    for word in words:
        assert word in lines[0]


def test_unknown_job(stack: Stack) -> None:
    result = relaunch(stack, "slurm", "job", "987654")
    assert_one_line_error(result, "job 987654 not found")
    assert result.returncode == 1


def test_unknown_node(stack: Stack) -> None:
    assert_one_line_error(relaunch(stack, "slurm", "drain", "n99", "--reason", "x"), "node n99")


@pytest.mark.parametrize("name", ["n1;rm -rf /", "$(id)", "-n1", "n1 n2"])
def test_hostile_node_name_never_reaches_slurm(stack: Stack, name: str) -> None:
    result = relaunch(stack, "slurm", "drain", "--reason", "x", "--", name)
    assert_one_line_error(result, "invalid node name")
    assert "DRAIN" not in relaunch(stack, "slurm", "nodes").stdout


def test_hostile_job_id_and_reason(stack: Stack) -> None:
    assert_one_line_error(relaunch(stack, "slurm", "requeue", "12;ls"), "invalid job id")
    assert_one_line_error(
        relaunch(stack, "slurm", "drain", "n1", "--reason", "a`id`"), "invalid reason"
    )


def test_controller_down_is_retryable_with_a_hint(stack: Stack, tmp_path: Path) -> None:
    dead = tmp_path / "slurm.conf"
    text = stack.slurm.conf.read_text()
    port = procs.free_port()
    dead.write_text(
        text.replace(f"SlurmctldPort={stack.config.slurmctld_port}", f"SlurmctldPort={port}")
    )
    result = relaunch(stack, "slurm", "jobs", conf=dead)
    assert_one_line_error(result, "controller does not answer", "hint:")
    assert result.returncode == 75  # EX_TEMPFAIL: try again later


def test_no_slurm_configuration(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "SLURM_CONF"}
    result = subprocess.run(
        [*RELAUNCH, "slurm", "nodes"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert_one_line_error(result, "no Slurm configuration", "SLURM_CONF")
