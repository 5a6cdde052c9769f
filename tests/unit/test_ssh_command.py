"""SSH mode without a server: the command line sent to sshd, the ssh section of the config, and
which runner a configuration builds."""

from __future__ import annotations

import json
import shlex
import subprocess
from pathlib import Path

import pytest
from pydantic import ValidationError

from relaunch.connectors.slurm.factory import slurm_cli
from relaunch.connectors.slurm.runner import LocalRunner
from relaunch.connectors.slurm.ssh import SshRunner, command_line
from relaunch.models.config import ClusterConfig, SshSettings
from relaunch.models.errors import InvalidNameError

CONF = {"SLURM_CONF": "/etc/slurm dir/slurm.conf"}
HOSTILE = [
    "x; touch /tmp/pwned",
    "$(id)",
    "`id`",
    "a\nb",
    "it's",
    '"quoted"',
    "${IFS}",
    "*",
    "-rf",
    "",
    "tab\there",
    "ünïcode",
]


def test_the_command_line_splits_back_into_the_exact_argv() -> None:
    argv = ["sbatch", "--parsable", *(f"--job-name={h}" for h in HOSTILE), *HOSTILE]
    line = command_line(argv, CONF, 30)
    assert shlex.split(line) == [
        "timeout",
        "--kill-after=1",
        "32",
        "env",
        "SLURM_CONF=/etc/slurm dir/slurm.conf",
        *argv,
    ]


def test_a_posix_shell_runs_the_command_line_as_the_same_argv(tmp_path: Path) -> None:
    # What sshd does with the line: the login shell parses it. Nothing in it may run.
    pwned = tmp_path / "pwned"
    words = [w.replace("/tmp/pwned", str(pwned)) for w in HOSTILE]
    line = command_line(["printf", "%s\\0", *words], {"A": f"$(touch {pwned})"}, 5)
    done = subprocess.run(["/bin/sh", "-c", line], capture_output=True, timeout=10, check=True)
    assert done.stdout.decode().split("\0")[:-1] == words
    assert not pwned.exists()


def test_timeouts_are_written_without_noise() -> None:
    assert shlex.split(command_line(["sinfo"], {}, 0.5))[:5] == [
        "timeout",
        "--kill-after=1",
        "2.5",
        "env",
        "sinfo",
    ]


@pytest.mark.parametrize(
    "argv",
    [[], ["-c"], ["A=1"], ["squeue; id"], ["squeue", "a\0b"], ["$(id)"], ["../bin/x"]],
)
def test_commands_that_could_change_meaning_are_refused(argv: list[str]) -> None:
    with pytest.raises(InvalidNameError):
        command_line(argv, {}, 30)


@pytest.mark.parametrize("env", [{"A B": "1"}, {"A=B": "1"}, {"1A": "x"}, {"A": "x\0y"}])
def test_bad_environment_entries_are_refused(env: dict[str, str]) -> None:
    with pytest.raises(InvalidNameError):
        command_line(["squeue"], env, 30)


def _ssh(**extra: object) -> dict[str, object]:
    return {
        "host": "login1.example.org",
        "user": "slurmops",
        "key_file": "/etc/relaunch/id_ed25519",
        "known_hosts": "/etc/relaunch/known_hosts",
        **extra,
    }


def test_ssh_settings_defaults() -> None:
    s = SshSettings.model_validate(_ssh())
    assert (s.port, s.connect_timeout_s, s.command_timeout_s, s.keepalive_s) == (22, 10, 30, 15)
    assert SshSettings.model_validate(_ssh(host="fd00::1")).host == "fd00::1"


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        ({"known_hosts": None}, "known_hosts"),
        ({"password": "hunter2"}, "password"),
        ({"host": "-oProxyCommand=sh"}, "host"),
        ({"host": "root@login1"}, "host"),
        ({"user": "Root; id"}, "user"),
        ({"port": 0}, "port"),
        ({"key_file": ""}, "key_file"),
        ({"command_timeout_s": 0}, "command_timeout_s"),
    ],
)
def test_invalid_ssh_settings_name_the_field(extra: dict[str, object], field: str) -> None:
    values = {k: v for k, v in _ssh(**extra).items() if v is not None}
    with pytest.raises(ValidationError) as err:
        SshSettings.model_validate(values)
    assert [e["loc"][-1] for e in err.value.errors()] == [field]


def _cluster(**extra: object) -> ClusterConfig:
    return ClusterConfig.model_validate(
        {
            "name": "c1",
            "slurm_conf": "/etc/slurm/slurm.conf",
            "database_url": "postgresql://x",
            "bundle_dir": "/tmp/b",
            **extra,
        }
    )


def test_the_ssh_section_picks_the_runner() -> None:
    local = slurm_cli(_cluster())
    assert isinstance(local._runner, LocalRunner)
    config = _cluster(ssh=_ssh(command_timeout_s=12))
    remote = slurm_cli(config)
    assert isinstance(remote._runner, SshRunner) and remote._timeout == 12
    # A config written to a file comes back the same (the worker and watcher read it so).
    again = ClusterConfig.model_validate(json.loads(config.model_dump_json()))
    assert again.ssh == config.ssh
