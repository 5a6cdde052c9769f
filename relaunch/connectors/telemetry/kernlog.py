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
import stat
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
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
    # The kernel's own message, as its source says: journald's kernel transport with
    # facility 0 (a line from a file says nothing of the kind).
    kernel: bool = False
    level: int | None = None


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
    priority = entry.get("PRIORITY")
    return KernelLine(
        node=node,
        text=text.rstrip("\n")[:MAX_TEXT],
        time=time,
        cursor=cursor if isinstance(cursor, str) else None,
        kernel=journal_kernel(entry),
        level=int(priority) if isinstance(priority, str) and priority in "01234567" else None,
    )


def journal_kernel(entry: dict[str, object]) -> bool:
    """Whether a journal entry is the kernel's own message: journald's kernel transport
    (``_TRANSPORT=kernel``: what journald read from /dev/kmsg; a field starting with ``_`` is
    set by journald, never by the sender) and facility LOG_KERN (journald keeps the facility a
    user-space write to /dev/kmsg was given, LOG_USER, in ``SYSLOG_FACILITY``)."""
    if entry.get("_TRANSPORT") != "kernel":
        return False
    facility = entry.get("SYSLOG_FACILITY")
    return facility is None or facility == "0"


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


# ---------------------------------------------------------------- /dev/kmsg

KMSG = "kmsg"
KMSG_PATH = "/dev/kmsg"
LOG_KERN = 0  # the kernel's own facility: /dev/kmsg refuses it from user-space writes
MAX_FIELDS = 8  # a record's dictionary (SUBSYSTEM=, DEVICE=): the first few are kept
MAX_RECORD = 8192  # the kernel's own limit on one /dev/kmsg read (CONSOLE_EXT_LOG_MAX)
_KMSG_HEAD = re.compile(r"(\d{1,4}),(\d{1,20}),(\d{1,20}),([^;,]{0,4})(?:,[^;]{0,64})?;")


@dataclass(frozen=True)
class KmsgRecord:
    """One ``/dev/kmsg`` record (Documentation/ABI/testing/dev-kmsg): ``pri,seq,usec,flags;``
    then the message, with every byte that is not printable already escaped ``\\xNN`` by the
    kernel (a newline in it too), then continuation lines, each starting with a space, that
    carry the record's dictionary (``SUBSYSTEM=pci``, ``DEVICE=+pci:0000:3b:00.0``)."""

    facility: int
    level: int
    seq: int
    usec: int  # since boot (the kernel's local clock)
    flags: str
    text: str
    fields: tuple[tuple[str, str], ...] = ()

    @property
    def kernel(self) -> bool:
        """Whether the kernel itself wrote it: facility LOG_KERN (0). A write to /dev/kmsg
        from user space (root's too) is given LOG_USER when it names no facility, and the
        kernel refuses to keep facility 0 from one (printk.c ``devkmsg_write``)."""
        return self.facility == LOG_KERN


def parse_kmsg(raw: bytes | str) -> KmsgRecord | None:
    """One record as a read of ``/dev/kmsg`` gives it; None for anything else (no header, a
    number out of range). Text that is not UTF-8 is replaced, never refused."""
    text = raw.decode("utf-8", errors="replace") if isinstance(raw, bytes) else raw
    head, *rest = text.split("\n")
    found = _KMSG_HEAD.match(head)
    if found is None:
        return None
    pri, seq, usec = int(found[1]), int(found[2]), int(found[3])
    if pri > 1023:
        return None
    fields: list[tuple[str, str]] = []
    for line in rest:
        if not line.startswith(" ") or len(fields) >= MAX_FIELDS:
            continue
        key, eq, value = line[1:].partition("=")
        if eq and key.isupper() and len(key) <= 32:
            fields.append((key, value[:200]))
    return KmsgRecord(
        facility=pri >> 3,
        level=pri & 7,
        seq=seq,
        usec=usec,
        flags=found[4],
        text=head[found.end() :][:MAX_TEXT],
        fields=tuple(fields),
    )


def split_records(data: bytes) -> tuple[list[bytes], bytes]:
    """Complete records of a kmsg-format stream (a file or a FIFO, whose reads do not stop at
    record ends as those of /dev/kmsg do): each header line with the continuation lines (a
    leading space) that follow it in ``data``; a continuation line whose record was handed on
    by an earlier call is dropped (it only repeats the record's dictionary). Returns them and
    the incomplete last line."""
    records: list[bytes] = []
    pos = 0
    while (end := data.find(b"\n", pos)) >= 0:
        line, pos = data[pos:end], end + 1
        if line.startswith(b" "):
            if records:
                records[-1] += b"\n" + line
            continue
        records.append(line)
    return records, data[pos:]


@dataclass
class KmsgStats:
    """What a kmsg reader lost: records overwritten before it read them (the gaps in the
    sequence numbers; ``overruns`` counts the reads that failed with EPIPE for it), and
    records it skipped for their facility."""

    lost: int = 0
    overruns: int = 0
    not_kernel: int = 0
    last_seq: int | None = None


class KmsgReader:
    """The kernel's own messages from ``/dev/kmsg``: every record of facility LOG_KERN, from
    the end of the ring buffer at start (or after ``after_seq``, a sequence number saved by an
    earlier run of this boot), never blocking.

    A record overwritten in the ring buffer before it was read makes the next read fail with
    EPIPE: the reader counts the failure (``stats.overruns``) and goes on with the oldest
    record still there; the records it never saw are the gap in the sequence numbers
    (``stats.lost``). ``path`` may also name a file or FIFO of records
    in the same format (the benchmark's and the tests' stand-in for a busy kernel)."""

    def __init__(self, node: str, *, path: str = KMSG_PATH, after_seq: int | None = None) -> None:
        self.node = node
        self.path = path
        self.stats = KmsgStats()
        self._fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        self._device = stat.S_ISCHR(os.fstat(self._fd).st_mode)
        self._pending = b""
        self._after = after_seq
        self.stats.last_seq = after_seq
        if self._device and after_seq is not None:
            os.lseek(self._fd, 0, os.SEEK_SET)  # from the oldest record still kept
        if self._device and after_seq is None:
            os.lseek(self._fd, 0, os.SEEK_END)  # from the next record on
        elif not self._device and after_seq is None and stat.S_ISREG(os.fstat(self._fd).st_mode):
            os.lseek(self._fd, 0, os.SEEK_END)

    @property
    def device(self) -> bool:
        """Whether this is /dev/kmsg itself (poll(2) says when a record is there)."""
        return self._device

    def fileno(self) -> int:
        return self._fd

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self._fd)

    def read(self, limit: int = 10_000) -> list[KmsgRecord]:
        """The kernel's records logged since the last read (at most ``limit``)."""
        raws: list[bytes] = []
        while len(raws) < limit:
            try:
                chunk = os.read(self._fd, MAX_RECORD)
            except BlockingIOError:
                break
            except BrokenPipeError:
                # EPIPE: the next record was overwritten before it was read; the read after
                # this one gives the oldest still kept (the gap in sequence numbers is counted).
                self.stats.overruns += 1
                continue
            if not chunk:
                break
            if self._device:
                raws.append(chunk)
            else:
                done, self._pending = split_records(self._pending + chunk)
                raws.extend(done)
        out: list[KmsgRecord] = []
        for raw in raws:
            record = parse_kmsg(raw)
            if record is None:
                continue
            last = self.stats.last_seq
            if self._after is not None and record.seq <= self._after:
                continue
            if last is not None and record.seq > last + 1:
                self.stats.lost += record.seq - last - 1
            self.stats.last_seq = record.seq
            if not record.kernel:
                self.stats.not_kernel += 1
                continue
            out.append(record)
        return out

    def lines(self, records: list[KmsgRecord]) -> list[KernelLine]:
        """The records as kernel lines (for the signature catalogue), dated by the wall
        clock: now, less how long ago since boot each was logged."""
        return [KernelLine(node=self.node, text=r.text, time=kmsg_time(r.usec)) for r in records]


def kmsg_time(usec: int, *, now: float | None = None, uptime: float | None = None) -> datetime:
    """The wall-clock time of a record stamped ``usec`` after boot (CLOCK_MONOTONIC: the
    kernel's printk clock on x86 and arm64; suspended time aside)."""
    real = time.time() if now is None else now
    since_boot = time.clock_gettime(time.CLOCK_MONOTONIC) if uptime is None else uptime
    return datetime.fromtimestamp(real - since_boot + usec / 1_000_000, tz=UTC)


def boot_id() -> str | None:
    """This boot's id (sequence numbers of /dev/kmsg start again at each boot)."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as fh:
            return fh.read().strip() or None
    except OSError:
        return None
