"""Build the Slurm backend a cluster's configuration asks for: the CLI (local, or over SSH), and
slurmrestd in front of it when the configuration has a ``slurmrestd`` section."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING

from relaunch.connectors.slurm.base import Scheduler, SchedulerReader
from relaunch.connectors.slurm.commands import SlurmCli
from relaunch.connectors.slurm.composite import SlurmRestScheduler
from relaunch.connectors.slurm.rest import JwtMinter, SlurmRest
from relaunch.connectors.slurm.runner import CommandRunner
from relaunch.connectors.slurm.ssh import SshRunner
from relaunch.models.config import ClusterConfig
from relaunch.models.endpoints import SlurmRestSettings

log = logging.getLogger("relaunch.slurm")

if TYPE_CHECKING:  # mypy proves that each backend satisfies its protocol
    _CLI: type[Scheduler] = SlurmCli
    _IN_CLUSTER: type[Scheduler] = SlurmRestScheduler
    _REST: type[SchedulerReader] = SlurmRest


def slurm_cli(config: ClusterConfig) -> SlurmCli:
    """``SlurmCli`` running its commands here, or on ``config.ssh.host`` when that is set
    (``slurm_conf`` is then a path on that host)."""
    if config.ssh is None:
        return SlurmCli(env=config.slurm_env)
    return SlurmCli(
        runner=SshRunner(config.ssh, env=config.remote_slurm_env),
        timeout=config.ssh.command_timeout_s,
        submit_as=config.ssh.user,
    )


def slurm_rest(settings: SlurmRestSettings) -> SlurmRest:
    """A slurmrestd client; with JWT, the key file is read now (a missing key fails at start)."""
    minter = None
    if settings.jwt_key_file is not None:
        assert settings.user is not None  # the settings' validator requires it
        minter = JwtMinter(
            Path(settings.jwt_key_file),
            settings.user,
            settings.token_lifetime_s,
            renew_before_s=settings.renew_before_s,
        )
    return SlurmRest(
        base_url=settings.base_url,
        socket_path=settings.socket_path,
        api_version=settings.api_version,
        minter=minter,
        timeout=settings.timeout_s,
    )


def slurm_scheduler(config: ClusterConfig) -> SlurmCli:
    """What the worker and the watcher use: ``slurm_cli(config)``, or, with a ``slurmrestd``
    section, a ``SlurmRestScheduler`` (reads, hold, release and cancel over slurmrestd; the
    other actions over that same CLI). Close it with ``close_scheduler``."""
    if config.slurmrestd is None:
        return slurm_cli(config)
    settings = config.slurmrestd
    runner: CommandRunner | None = None
    timeout = 30.0
    submit_as = None
    if config.ssh is not None:
        runner, timeout = (
            SshRunner(config.ssh, env=config.remote_slurm_env),
            config.ssh.command_timeout_s,
        )
        submit_as = config.ssh.user
    scheduler = SlurmRestScheduler(
        slurm_rest(settings),
        env=config.slurm_env,
        runner=runner,
        timeout=timeout,
        submit_as=submit_as,
    )
    log.info(
        "Slurm reads over slurmrestd %s (%s, data parser %s), drains and requeues over the CLI",
        settings.base_url if settings.socket_path is None else settings.socket_path,
        f"JWT as {settings.user}" if settings.jwt_key_file else "local auth",
        settings.api_version,
    )
    return scheduler


async def close_scheduler(scheduler: Scheduler) -> None:
    """Release what ``slurm_scheduler`` opened (slurmrestd's HTTP connections)."""
    if isinstance(scheduler, SlurmRestScheduler):
        await scheduler.aclose()
