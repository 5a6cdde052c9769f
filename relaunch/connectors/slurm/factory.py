"""Build the Slurm CLI backend a cluster's configuration asks for: local, or over SSH."""

from __future__ import annotations

from relaunch.connectors.slurm.cli import SlurmCli
from relaunch.connectors.slurm.ssh import SshRunner
from relaunch.models.config import ClusterConfig


def slurm_cli(config: ClusterConfig) -> SlurmCli:
    """``SlurmCli`` running its commands here, or on ``config.ssh.host`` when that is set
    (``slurm_conf`` is then a path on that host)."""
    if config.ssh is None:
        return SlurmCli(env=config.slurm_env)
    return SlurmCli(
        runner=SshRunner(config.ssh, env=config.slurm_env), timeout=config.ssh.command_timeout_s
    )
