"""Run the Slurm commands on a login/controller host over SSH (asyncssh).

The same argv that ``LocalRunner`` executes is sent as one command line, quoted with
``shlex.join``: sshd hands that line to the remote account's login shell, which splits it back
into exactly the argv we validated, so nothing in a job name, comment or reason can become shell
syntax. The remote account's login shell must be a POSIX shell (sh, bash, dash, zsh).

One connection is reused for every command (opened on first use, under a lock). A connection
found dead before a command starts is reopened once; after that, or when it drops while a command
runs (the command may have run, so it is not repeated here), ``SshUnavailableError`` (retryable)
is raised and the caller's idempotent check-act-verify decides. An unknown or changed host key
and a refused client key are not retryable.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import shlex
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import asyncssh

from relaunch.connectors.slurm.runner import CONTROLLER_HINT, CommandResult
from relaunch.models.config import SshSettings
from relaunch.models.errors import (
    InvalidNameError,
    SchedulerError,
    SchedulerTimeoutError,
    SshAuthError,
    SshHostKeyError,
    SshUnavailableError,
)

log = logging.getLogger("relaunch.ssh")

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
# A program name: no option, no assignment (``env`` would read NAME=VALUE as one), no path tricks.
_PROGRAM = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+-]{0,63}|/[A-Za-z0-9_./+-]{1,255}")
# The remote ``timeout`` fires this much after our own deadline: it is the backstop that kills
# the command when we could not (sshd ignores the SSH "signal" request; a lost connection).
_REMOTE_GRACE_S = 2.0
_TIMEOUT_EXITS = (124, 137)  # coreutils timeout: TERM sent / KILL sent


def command_line(argv: Sequence[str], env: Mapping[str, str], timeout: float) -> str:
    """The one line sent to sshd for ``argv``: ``timeout`` (a remote kill switch), ``env`` with
    the environment overlay, then the command, every word quoted by ``shlex.join``."""
    if not argv:
        raise InvalidNameError("empty command")
    if not _PROGRAM.fullmatch(argv[0]):
        raise InvalidNameError(
            f"invalid program {argv[0]!r}", hint=f"must match {_PROGRAM.pattern}"
        )
    for key in env:
        if not _ENV_NAME.fullmatch(key):
            raise InvalidNameError(f"invalid environment variable name {key!r}")
    assignments = [f"{key}={value}" for key, value in env.items()]
    if any("\0" in word for word in [*assignments, *argv]):
        # A NUL cannot travel inside a C string on the remote side: refuse rather than truncate.
        raise InvalidNameError(f"{argv[0]}: an argument or variable holds a NUL byte")
    limit = f"{timeout + _REMOTE_GRACE_S:g}"
    return shlex.join(["timeout", "--kill-after=1", limit, "env", *assignments, *argv])


class SshRunner:
    """Runs commands on ``settings.host`` over one reused SSH connection (``CommandRunner``).

    ``env`` (typically ``SLURM_CONF``, a path on that host) is applied with ``env NAME=VALUE``
    inside the quoted command line, so the server needs no ``AcceptEnv``."""

    def __init__(self, settings: SshSettings, env: Mapping[str, str] | None = None) -> None:
        self._settings = settings
        self._env = dict(env or {})
        self._conn: asyncssh.SSHClientConnection | None = None
        self._lock = asyncio.Lock()
        self._sessions = asyncio.Semaphore(settings.max_sessions)
        self.commands_sent = 0
        self.connections_opened = 0

    @property
    def target(self) -> str:
        s = self._settings
        return f"{s.user}@{s.host}:{s.port}"

    # ---------------------------------------------------------------- connection

    async def _connection(self) -> asyncssh.SSHClientConnection:
        async with self._lock:
            if self._conn is not None and not self._conn.is_closed():
                return self._conn
            self._conn = await self._connect()
            return self._conn

    async def _connect(self) -> asyncssh.SSHClientConnection:
        s = self._settings
        known_hosts = _read_known_hosts(s.known_hosts)
        key = _read_key(s.key_file)
        try:
            conn = await asyncssh.connect(
                s.host,
                s.port,
                username=s.user,
                known_hosts=known_hosts,
                client_keys=[key],
                preferred_auth="publickey",
                password=None,
                kbdint_auth=False,
                agent_path=None,  # only the configured key, never whatever an agent offers
                config=None,  # no ~/.ssh/config: this configuration is the whole truth
                connect_timeout=s.connect_timeout_s,
                keepalive_interval=s.keepalive_s,
                keepalive_count_max=3,
            )
        except asyncssh.HostKeyNotVerifiable as exc:
            raise SshHostKeyError(
                f"the host key of {s.host}:{s.port} is not trusted: it is not in "
                f"{s.known_hosts}, or differs from the key recorded there ({exc.reason})",
                hint="check the host's key fingerprint out of band and add it to that "
                "known_hosts file; Relaunch never accepts an unknown or changed key",
            ) from exc
        except asyncssh.PermissionDenied as exc:
            raise SshAuthError(
                f"{self.target} refused the key {s.key_file}",
                hint="add its public key to the account's authorized_keys",
            ) from exc
        except (OSError, TimeoutError, asyncssh.Error) as exc:
            raise SshUnavailableError(
                f"cannot reach sshd at {s.host}:{s.port}: {_describe(exc)}",
                hint="is the host up and sshd listening there?",
            ) from exc
        self.connections_opened += 1
        log.info("ssh connection to %s open", self.target)
        return conn

    async def _discard(self, conn: asyncssh.SSHClientConnection) -> None:
        async with self._lock:
            if self._conn is conn:
                self._conn = None
        conn.close()

    async def close(self) -> None:
        """Close the connection (a later command opens a new one)."""
        async with self._lock:
            conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()
            with contextlib.suppress(Exception):
                await conn.wait_closed()

    # ---------------------------------------------------------------- commands

    async def run(
        self, argv: Sequence[str], *, stdin: str | None = None, timeout: float = 30.0
    ) -> CommandResult:
        timeout = min(timeout, self._settings.command_timeout_s)
        line = command_line(argv, self._env, timeout)
        async with self._sessions:
            start = time.monotonic()
            conn, process = await self._start(line, stdin)
            self.commands_sent += 1
            try:
                done = await process.wait(check=False, timeout=timeout)
            except TimeoutError as exc:
                # sshd does not deliver signals to the command; closing the channel stops our
                # wait, and the remote `timeout` kills the command moments later.
                raise SchedulerTimeoutError(
                    f"{argv[0]} did not answer within {timeout:g}s (on {self._settings.host})",
                    hint=CONTROLLER_HINT,
                ) from exc
            except (OSError, asyncssh.Error) as exc:
                await self._discard(conn)
                raise self._dropped(argv[0]) from exc
            finally:
                process.close()
            seconds = time.monotonic() - start
        if done.exit_status is None and done.exit_signal is None:
            # The channel closed without an exit status: the connection went away mid-command.
            await self._discard(conn)
            raise self._dropped(argv[0])
        returncode = done.returncode if done.returncode is not None else -1
        if returncode in _TIMEOUT_EXITS and seconds >= timeout:
            raise SchedulerTimeoutError(
                f"{argv[0]} did not answer within {timeout:g}s (on {self._settings.host})",
                hint=CONTROLLER_HINT,
            )
        if returncode == 127:
            raise SchedulerError(
                f"{argv[0]}: command not found on {self._settings.host}",
                hint="install slurm-client on that host, or check the account's PATH",
            )
        return CommandResult(
            argv=tuple(argv),
            returncode=returncode,
            stdout=_text(done.stdout),
            stderr=_text(done.stderr),
            seconds=seconds,
        )

    def _dropped(self, program: str) -> SshUnavailableError:
        return SshUnavailableError(
            f"the connection to {self.target} dropped while {program} ran; "
            "it may or may not have taken effect",
            hint="retry: every action reads fresh state before acting",
        )

    async def _start(
        self, line: str, stdin: str | None
    ) -> tuple[asyncssh.SSHClientConnection, asyncssh.SSHClientProcess[str]]:
        """Open a session for ``line``; a connection found dead first is reopened once."""
        for attempt in (1, 2):
            conn = await self._connection()
            try:
                if stdin is None:
                    process = await conn.create_process(
                        line, stdin=asyncssh.DEVNULL, encoding="utf-8", errors="replace"
                    )
                else:
                    process = await conn.create_process(
                        line, input=stdin, encoding="utf-8", errors="replace"
                    )
                return conn, process
            except (OSError, asyncssh.Error) as exc:
                await self._discard(conn)
                if attempt == 2:
                    raise SshUnavailableError(
                        f"cannot open a session on {self.target}: {_describe(exc)}",
                        hint="is sshd still running there?",
                    ) from exc
                log.info("ssh connection to %s lost (%s); reconnecting", self.target, exc)
        raise AssertionError("unreachable")


def _read_known_hosts(path: str) -> asyncssh.SSHKnownHosts:
    try:
        return asyncssh.read_known_hosts(str(Path(path).expanduser()))
    except (OSError, ValueError) as exc:
        raise SshHostKeyError(
            f"cannot read the known_hosts file {path}: {_describe(exc)}",
            hint="ssh.known_hosts must name an OpenSSH known_hosts file holding the host's key",
        ) from exc


def _read_key(path: str) -> asyncssh.SSHKey:
    try:
        return asyncssh.read_private_key(str(Path(path).expanduser()))
    except (OSError, asyncssh.KeyImportError) as exc:
        raise SshAuthError(
            f"cannot read the SSH key {path}: {_describe(exc)}",
            hint="ssh.key_file must name an unencrypted private key readable by Relaunch",
        ) from exc


def _describe(exc: BaseException) -> str:
    return str(exc) or type(exc).__name__


def _text(value: object) -> str:
    if value is None:
        return ""
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    return str(value)
