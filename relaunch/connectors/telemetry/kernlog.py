"""Kernel log lines from a node: a file (``/var/log/kern.log``) or the systemd journal.

Both yield raw :class:`KernelLine` objects; deciding which lines matter is the signature
catalogue's job (the agent matches each line). This module only reads, and pulls the PCI
address out of a driver line so that a sample can name the GPU or switch.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
from collections.abc import AsyncIterator
from datetime import UTC, datetime

from pydantic import BaseModel

from relaunch.connectors.logs import FileTail
from relaunch.detection.lines import LineSplitter
from relaunch.models.errors import RelaunchError

JOURNAL = "journal"
MAX_TEXT = 2000
# The address in `NVRM: Xid (PCI:0000:07:00): ...` and `nvidia-nvswitch0: SXid (PCI:...)`,
# and the device in `mlx5_core 0000:03:00.0: ...`.
_PCI_IN_LINE = re.compile(
    r"\(PCI:(?P<xid>[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}(?:\.[0-7])?)"
    r"|mlx5_core (?P<nic>[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7])"
)


class KernelLogError(RelaunchError):
    """The kernel log cannot be read (journalctl missing or failing)."""

    retryable = True


class KernelLine(BaseModel):
    """One kernel log line as read, with the node it came from."""

    node: str
    text: str
    time: datetime | None = None
    cursor: str | None = None


def pci_in_line(text: str) -> str | None:
    """The PCI address a driver line names (GPU, NVSwitch or NIC), as printed; else None."""
    found = _PCI_IN_LINE.search(text)
    if not found:
        return None
    return found.group("xid") or found.group("nic")


class KernelLogFile:
    """Incremental reader of a kernel log file; rotation and truncation safe (FileTail)."""

    def __init__(self, path: str | os.PathLike[str], node: str, *, from_end: bool = True) -> None:
        self.path = os.fspath(path)
        self.node = node
        self._tail = FileTail.at_end(path) if from_end else FileTail(path)
        self._lines = LineSplitter()

    def read(self) -> list[KernelLine]:
        """The complete lines appended since the last read."""
        before = self._tail.truncations
        data = self._tail.read()
        if self._tail.truncations != before:
            self._lines.reset()
        return [
            KernelLine(node=self.node, text=raw.decode("utf-8", errors="replace")[:MAX_TEXT])
            for raw in self._lines.feed(data)
            if raw.strip()
        ]


def parse_journal_entry(raw: bytes | str, node: str) -> KernelLine | None:
    """One line of ``journalctl -o json`` as a KernelLine; None for a line that is not an
    entry with a message. ``MESSAGE`` may be a string, an array of bytes (journald's form for
    text that is not valid UTF-8 or holds control characters) or null."""
    try:
        entry = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(entry, dict):
        return None
    message = entry.get("MESSAGE")
    if isinstance(message, list) and all(isinstance(b, int) and 0 <= b < 256 for b in message):
        text = bytes(message).decode("utf-8", errors="replace")
    elif isinstance(message, str):
        text = message
    else:
        return None
    time: datetime | None = None
    stamp = entry.get("__REALTIME_TIMESTAMP")
    if isinstance(stamp, str) and stamp.isdigit():
        time = datetime.fromtimestamp(int(stamp) / 1_000_000, tz=UTC)
    cursor = entry.get("__CURSOR")
    return KernelLine(
        node=node,
        text=text.rstrip("\n")[:MAX_TEXT],
        time=time,
        cursor=cursor if isinstance(cursor, str) else None,
    )


def journal_argv(
    *,
    follow: bool = True,
    since: datetime | None = None,
    after_cursor: str | None = None,
    journalctl: str = "journalctl",
) -> list[str]:
    """The ``journalctl`` command for kernel messages as JSON: from now on (``follow``), since
    a time, or after a cursor."""
    argv = [journalctl, "-k", "-o", "json", "--no-pager"]
    if after_cursor:
        argv.append(f"--after-cursor={after_cursor}")
    elif since is not None:
        argv.append(f"--since={since.astimezone(UTC).strftime('%Y-%m-%d %H:%M:%S')} UTC")
    elif follow:
        argv += ["-n", "0"]
    if follow:
        argv.append("-f")
    return argv


class JournalReader:
    """Kernel lines from the systemd journal via ``journalctl -k -o json`` (argv, no shell).

    :meth:`follow` streams new lines until cancelled (the process is then terminated);
    :meth:`read_since` returns what was logged since a time, within a timeout.
    """

    def __init__(
        self,
        node: str,
        *,
        journalctl: str = "journalctl",
        timeout: float = 30.0,
    ) -> None:
        self.node = node
        self.journalctl = journalctl
        self.timeout = timeout
        self.cursor: str | None = None

    async def follow(self) -> AsyncIterator[KernelLine]:
        """New kernel lines as they are logged (after the last cursor seen, if any)."""
        argv = journal_argv(follow=True, after_cursor=self.cursor, journalctl=self.journalctl)
        proc = await self._spawn(argv)
        assert proc.stdout is not None
        try:
            while True:
                raw = await proc.stdout.readline()
                if not raw:
                    break
                line = self._take(raw)
                if line is not None:
                    yield line
            code = await proc.wait()
            stderr = await proc.stderr.read() if proc.stderr else b""
            raise KernelLogError(_exit_message(argv, code, stderr))
        finally:
            await _stop(proc)

    async def read_since(self, since: datetime) -> list[KernelLine]:
        """Kernel lines logged since ``since``."""
        argv = journal_argv(follow=False, since=since, journalctl=self.journalctl)
        proc = await self._spawn(argv)
        try:
            out, err = await asyncio.wait_for(proc.communicate(), self.timeout)
        except TimeoutError:
            await _stop(proc)
            raise KernelLogError(f"{argv[0]} did not finish within {self.timeout:g}s") from None
        if proc.returncode != 0:
            raise KernelLogError(_exit_message(argv, proc.returncode, err))
        return [line for raw in out.splitlines() if (line := self._take(raw)) is not None]

    def _take(self, raw: bytes) -> KernelLine | None:
        line = parse_journal_entry(raw, self.node)
        if line is not None and line.cursor:
            self.cursor = line.cursor
        return line

    async def _spawn(self, argv: list[str]) -> asyncio.subprocess.Process:
        try:
            return await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                limit=1 << 20,
            )
        except OSError as exc:
            raise KernelLogError(f"cannot run {argv[0]}: {exc.strerror or exc}") from exc


def _exit_message(argv: list[str], code: int | None, stderr: bytes) -> str:
    detail = stderr.decode(errors="replace").strip().splitlines()[-1:] or [""]
    return f"{argv[0]} exited with {code}: {detail[0][:200]}"


async def _stop(proc: asyncio.subprocess.Process) -> None:
    if proc.returncode is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        proc.terminate()
    try:
        await asyncio.wait_for(proc.wait(), 5)
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await proc.wait()
