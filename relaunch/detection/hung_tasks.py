"""Hung-task reports in a node's kernel log whose stacks are in a network file system.

The kernel's hung-task detector (kernel/hung_task.c, ``check_hung_task``) reports a task that
stayed in uninterruptible sleep past ``hung_task_timeout_secs`` (120 s by default)::

    INFO: task python3:41231 blocked for more than 120 seconds.
          Not tainted 5.15.0-91-generic #101-Ubuntu
    "echo 0 > /proc/sys/kernel/hung_task_timeout_secs" disables this message.
    task:python3 state:D stack:0 pid:41231 ppid:41200 flags:0x00004002
    Call Trace:
     <TASK>
     __schedule+0x2e6/0x6a0
     rpc_wait_bit_killable+0x25/0xb0 [sunrpc]
     nfs_wait_on_request+0x1d/0x30 [nfs]

Up to 4.x each frame carries its address (``[<ffffffffc05523b4>] llog_process+0x14/0x20
[obdclass]``), and a syslog line may carry the kernel's stamp or not. When the stack runs through a
network file system's module (Lustre's ``ptlrpc``/``obdclass``/``osc``..., GPFS's ``mmfs26`` and
``mmfslinux``, NFS's ``nfs``/``sunrpc``, ``ceph``, ``beegfs``, ``cifs``), the task is waiting on
that file system: the root of a "hang" whose ranks stopped in I/O (a checkpoint, a data read) is
storage, and a restart (not a drain) is right.

Trust (docs/trust.md): only a node's own kernel log is read here, every line through the
kernel's prefix (:func:`kernel_message`, :func:`kernel_frame`); the report's comm is the user's
and is never read; a line with the same kernel stamp as a report about a user process just
before it is a piece of that report (a file name with a newline), never a frame.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime

from relaunch.detection.kernel_lines import (
    KernelMessage,
    kernel_frame,
    kernel_message,
    reports_user_process,
    without_comm,
)
from relaunch.detection.lines import line_timestamp
from relaunch.detection.signatures import MAX_LINE

# Kernel modules of network file systems → the file system's name.
FILESYSTEM_MODULES: dict[str, str] = {
    **dict.fromkeys(("mmfs26", "mmfslinux", "tracedev"), "GPFS"),
    **dict.fromkeys(
        (
            "lustre",
            "lov",
            "osc",
            "mdc",
            "lmv",
            "ptlrpc",
            "obdclass",
            "lnet",
            "libcfs",
            "ko2iblnd",
            "ksocklnd",
            "mgc",
            "fid",
            "fld",
        ),
        "Lustre",
    ),
    **dict.fromkeys(("nfs", "nfsv3", "nfsv4", "sunrpc", "lockd"), "NFS"),
    **dict.fromkeys(("ceph", "libceph"), "CephFS"),
    "beegfs": "BeeGFS",
    "cifs": "CIFS/SMB",
}
# NFS built into the kernel prints its frames without a module.
_NFS_FUNCTIONS = ("nfs_", "nfs4_", "rpc_wait_bit_killable", "__rpc_execute")
_HEADER = re.compile(r"INFO: task .{1,15}:\d{1,10} blocked for more than (\d{1,10}) seconds\.")
# How many lines after a header its stack may take (a dump is about 20 to 40 lines).
STACK_LINES = 64
_WORD = "blocked for more than"


@dataclass
class HungTask:
    """One hung-task report: where it is, when, how long the task was blocked and the file
    systems its stack runs through (empty: none of the known ones)."""

    line_no: int
    text: str
    seconds: int
    time: datetime | None
    filesystems: list[str] = field(default_factory=list)


def hung_tasks(text: str) -> list[HungTask]:
    """The hung-task reports of one node's kernel log, each with the file systems its stack
    runs through. Only the lines around a report are parsed: a log without the report's words
    costs one substring search, a long log with a few reports a few dozen lines each. Lines are
    read on their first MAX_LINE characters, as the scan reads them."""
    out: list[HungTask] = []
    for found in lines_with(text, _WORD):
        message = found.message
        header = _HEADER.match(message.text) if message is not None else None
        if (
            message is not None
            and header is not None
            and not piece_of_user_report(text, found.start, message.stamp)
        ):
            task = HungTask(
                found.line_no, found.line[:500], int(header[1]), line_timestamp(found.line)
            )
            task.filesystems = _stack(text, found.end)
            out.append(task)
    return out


@dataclass(frozen=True)
class WordLine:
    """A line of a kernel log that holds a word: where it is, its text, the kernel's message."""

    start: int
    end: int
    line_no: int
    line: str
    message: KernelMessage | None


def lines_with(text: str, word: str) -> Iterator[WordLine]:
    """Each line of ``text`` holding ``word``, in order, with its number (from 1), its first
    MAX_LINE characters and the kernel's message in it (None when it is not the kernel's). A
    text without the word costs one substring search."""
    counted, line_no = 0, 1
    pos = text.find(word)
    while pos != -1:
        start = text.rfind("\n", 0, pos) + 1
        end = line_end(text, pos)
        line_no += text.count("\n", counted, start)
        counted = start
        line = kernel_line(text, start, end)
        yield WordLine(start, end, line_no, line, kernel_message(line))
        pos = text.find(word, end)


def line_end(text: str, at: int) -> int:
    end = text.find("\n", at)
    return len(text) if end == -1 else end


def kernel_line(text: str, start: int, end: int) -> str:
    return text[start : min(end, start + MAX_LINE)].removesuffix("\r")


def piece_of_user_report(text: str, start: int, stamp: str | None) -> bool:
    """Whether the line at ``start`` is a piece of a report about a user process: a kernel
    line with its stamp, just before it, reports one (a file name holding a newline)."""
    if stamp is None:
        return False
    end = start - 1
    for _ in range(STACK_LINES):
        if end < 0:
            return False
        begin = text.rfind("\n", 0, end) + 1
        message = kernel_message(kernel_line(text, begin, end))
        end = begin - 1
        if message is None:
            continue
        if message.stamp != stamp:
            return False
        if _HEADER.match(message.text) is None and reports_user_process(without_comm(message.text)):
            return True
    return False


def _stack(text: str, after: int) -> list[str]:
    """The file systems of the frames in the lines after a report (up to STACK_LINES, to the
    next report), skipping the pieces of a user process's report."""
    systems: list[str] = []
    user_stamp: str | None = None
    start = after + 1
    for _ in range(STACK_LINES):
        if start > len(text):
            break
        end = line_end(text, start)
        line = kernel_line(text, start, end)
        start = end + 1
        if _WORD in line:
            break  # the next report reads its own stack
        message = kernel_message(line)
        frame = kernel_frame(line) if message is None or "+0x" in message.text else None
        line_stamp = message.stamp if message is not None else frame.stamp if frame else None
        if line_stamp is not None and line_stamp == user_stamp:
            continue  # a piece of a report about a user process: its text is the user's
        if frame is not None:
            fs = _filesystem(frame.function, frame.module)
            if fs and fs not in systems:
                systems.append(fs)
        elif message is not None and reports_user_process(without_comm(message.text)):
            user_stamp = line_stamp
    return systems


def _filesystem(function: str, module: str | None) -> str | None:
    if module is not None:
        return FILESYSTEM_MODULES.get(module)
    if function.startswith(_NFS_FUNCTIONS):
        return "NFS"
    return None
