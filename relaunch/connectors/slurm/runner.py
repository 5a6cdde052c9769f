"""Run a Slurm command: argv lists only, a timeout on every call, typed errors.

The runner is the seam for remote execution: the local runner executes argv here; the SSH runner
(``ssh.py``) sends the same argv, quoted, to a login/controller host.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from relaunch.models.errors import (
    ControllerUnavailableError,
    SchedulerError,
    SchedulerTimeoutError,
)

# What Slurm's clients print when slurmctld cannot be reached. The CLI has no other channel for
# this (the exit code is 1 for every failure), so these strings are the contract.
_CONTROLLER_DOWN = (
    "Unable to contact slurm controller",
    "Socket timed out on send/recv",
    "Connection refused",
    "Zero Bytes were transmitted or received",
    "Communication connection failure",
)
CONTROLLER_HINT = "is slurmctld running, and does SLURM_CONF point at its slurm.conf?"


@dataclass(frozen=True)
class CommandResult:
    argv: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str
    seconds: float


class CommandRunner(Protocol):
    async def run(
        self, argv: Sequence[str], *, stdin: str | None = None, timeout: float = 30.0
    ) -> CommandResult: ...


class LocalRunner:
    """Runs commands on this host with an optional environment overlay (``SLURM_CONF``)."""

    def __init__(self, env: Mapping[str, str] | None = None) -> None:
        self._env = {**os.environ, **(env or {})}

    async def run(
        self, argv: Sequence[str], *, stdin: str | None = None, timeout: float = 30.0
    ) -> CommandResult:
        start = time.monotonic()
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                env=self._env,
            )
        except FileNotFoundError as exc:
            raise SchedulerError(
                f"{argv[0]}: command not found", hint="install slurm-client (make deps)"
            ) from exc
        try:
            out, err = await asyncio.wait_for(
                proc.communicate(stdin.encode() if stdin is not None else None), timeout
            )
        except TimeoutError as exc:
            proc.kill()
            await proc.wait()
            raise SchedulerTimeoutError(
                f"{argv[0]} did not answer within {timeout:g}s", hint=CONTROLLER_HINT
            ) from exc
        return CommandResult(
            argv=tuple(argv),
            returncode=proc.returncode if proc.returncode is not None else -1,
            stdout=out.decode(errors="replace"),
            stderr=err.decode(errors="replace"),
            seconds=time.monotonic() - start,
        )


def raise_for_controller(result: CommandResult) -> None:
    """Raise ControllerUnavailableError when the output says slurmctld is unreachable, and a
    SchedulerError with a hint when the client found no slurm.conf at all."""
    text = result.stderr + result.stdout
    if "Could not establish a configuration source" in text:
        raise SchedulerError(
            f"{result.argv[0]}: no Slurm configuration found",
            hint="set SLURM_CONF (or pass --slurm-conf), or run `relaunch dev up`",
        )
    if any(marker in text for marker in _CONTROLLER_DOWN):
        raise ControllerUnavailableError(
            f"{result.argv[0]}: the Slurm controller does not answer", hint=CONTROLLER_HINT
        )


def failure(result: CommandResult) -> SchedulerError:
    """A SchedulerError describing a failed command, without its full output."""
    tail = (result.stderr.strip() or result.stdout.strip()).splitlines()[-1:] or [""]
    return SchedulerError(
        f"{' '.join(result.argv[:3])} failed (exit {result.returncode}): {tail[0]}"
    )
