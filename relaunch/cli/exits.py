"""How every `relaunch` command reports a RelaunchError: one line, a meaningful exit code."""

from __future__ import annotations

import sys
from typing import NoReturn

import click

from relaunch.cli.terminal import printable
from relaunch.models.config_check import ConfigError
from relaunch.models.errors import RelaunchError

EX_TEMPFAIL = 75  # sysexits.h: try again later


def exit_code(exc: RelaunchError) -> int:
    return EX_TEMPFAIL if exc.retryable else 1


def fail(exc: RelaunchError) -> NoReturn:
    # An error may quote a job's name or a user's path: never an escape to the terminal.
    if isinstance(exc, ConfigError):  # every problem of a configuration, one line each
        for line in exc.problems:
            click.echo(printable(line), err=True)
    click.echo(printable(f"error: {exc}"), err=True)
    sys.exit(exit_code(exc))
