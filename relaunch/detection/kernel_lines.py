"""Where a kernel-log line's own message starts, and whether it reports a user process.

A node's kernel log is trusted because the kernel writes it, but the kernel's reports quote text
a user chooses: a process's ``comm`` (15 characters, set with ``prctl``), a mapped file's name in
a segfault or ``traps:`` report, a cgroup's name in an OOM report, the ``name=`` of an Xid line.
A signature therefore counts in a trusted kernel source only where the driver writes it: at the
start of the message, after the kernel's own prefix (:func:`kernel_message`), and never on a line
that reports a user process (:func:`reports_user_process`), whatever that line quotes.

Shapes read (one line each; a line in none of them is no kernel message):

- a bare message, ``dmesg``'s ``[  123.456789] msg``, ``dmesg -r``/``/proc/kmsg``'s
  ``<6>[  123.456789] msg``, ``dmesg -T``'s ``[Fri Dec  4 22:40:32 2026] msg``,
  ``dmesg --time-format iso``'s ``2026-12-04T22:40:32,123456+00:00 msg``, ``dmesg -x``'s
  ``kern  :info  : msg``, and the caller id ``[T123]``/``[C1]`` after the stamp;
- a ``/dev/kmsg`` record ``pri,seq,usec,flags;msg``;
- a syslog or ``journalctl -k`` line (BSD or RFC 3339 time, ``short``, ``short-precise``,
  ``short-iso``) whose tag is exactly ``kernel:``; any other tag (``logger -t anything``,
  ``kernel[123]:``) is a user-space line.

A priority says the facility: ``<N>`` or a kmsg ``pri`` of 8 or more is not the kernel's
(userspace writes to ``/dev/kmsg`` get ``LOG_USER``, kernel/printk/printk.c ``devkmsg_write``).
A line that starts with white space is the continuation of a record (``dmesg`` indents the
pieces of a message that holds a newline) and never a message start.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_STAMP = r"\[ *\d{1,10}\.\d{1,9}\]"
_KERNEL_PREFIX = re.compile(
    # /dev/kmsg: `pri,seq,usec,flags[,...];message`
    r"(?:(?P<kmsg>\d{1,4}),\d{1,20},\d{1,20},[^;,]{0,4}(?:,[^;]{0,32})?;"
    r"|(?:<(?P<pri>\d{1,4})>)?"
    # a syslog / journalctl header: time, host, tag
    r"(?:(?:\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(?:\.\d{1,9})?(?:Z|[+-]\d\d:?\d\d)?"
    r"|[A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d(?:\.\d{1,9})?)"
    r" \S{1,255} (?P<tag>[^\s:\[]{1,64}(?P<tagpid>\[\d{1,10}\])?): ?"
    # dmesg --time-format iso (a comma before the fraction), dmesg -T, dmesg -x
    r"|\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d,\d{6}[+-]\d\d:\d\d "
    r"|\[[A-Z][a-z]{2} [A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d \d{4}\] ?"
    r"|(?P<facility>[a-z]{2,8}) *:[a-z]{2,8} *: "
    r"|kernel: ?)?)"
    r"(?:<(?P<level>\d{1,4})>)?"
    rf"(?P<stamp>{_STAMP})? ?(?:\[ *[TC]\d{{1,10}}\] ?)?"
)

# A process's comm: up to 15 bytes of anything, each of which /dev/kmsg may print as `\xNN`.
_COMM = r"(?:\\x[0-9a-f]{2}|[^\n]){0,15}"
# What the kernel prints about a user process. Most start with the process's comm: a comm that
# imitates a driver's words sits at the message start.
_USER_START = re.compile(
    rf"(?:{_COMM}\[\d{{1,10}}\](?::| (?:general protection|trap|bad frame|vsyscall))"
    r"|traps: "
    r"|potentially unexpected fatal signal"
    rf"|{_COMM} invoked oom-killer: "
    r"|(?:Out of memory|Memory cgroup out of memory)(?: \([\w ]{1,40}\))?: Kill"
    r"|oom-kill:|oom_reaper: |Memory cgroup stats for |Task in /"
    rf"|INFO: task {_COMM}:\d{{1,10}} blocked"
    r"|CPU: \d{1,6} (?:UID: \d{1,10} )?PID: \d{1,10} Comm: )"
)
# A user frame, as print_vma_addr writes it (arch/x86/mm/fault.c show_signal_msg and others):
# ` in <file name>[<start>+<size>]`, since 6.x `[<offset>,<start>+<size>]`. The file name is
# the user's, and may hold a newline.
_USER_FRAME = re.compile(r"\[(?:[0-9a-f]{1,16},)?[0-9a-f]{1,16}\+[0-9a-f]{1,16}\]")
# The comm an Xid line quotes after the code: `, pid=<n>, name=<comm>, ` (comm: at most 15
# characters, and may itself hold ", "). The cut goes to the last ", " the comm could reach.
_XID_COMM = re.compile(rf"(,\s?(?:pid=(?:\d{{1,10}}|'<unknown>'),\s?)?)name={_COMM}, ")
_XID_START = re.compile(r"NVRM: Xid \([^)]{0,64}\): \d{1,6}")


@dataclass(frozen=True)
class KernelMessage:
    """A kernel line's message (from its first character) and the kernel's own stamp, if any."""

    text: str
    stamp: str | None


@dataclass
class KernelRecord:
    """What the previous line of one kernel log said, carried from line to line (and between
    reads of the log): the ``syslog(2)`` interface (``/proc/kmsg``, which rsyslog's imklog reads;
    ``dmesg -S``) splits a record at each newline its text holds and gives every piece the same
    prefix and stamp, so a file name ``x\\nNVRM: Xid ...`` in a segfault report becomes a line of
    its own. A piece is known only by the piece before it: the same stamp as a line that reports
    a user process."""

    stamp: str | None = None
    user: bool = False


def kernel_message(line: str) -> KernelMessage | None:
    """The message of a kernel-log line, or None when the line is not the kernel's: another
    syslog tag, a priority whose facility is not the kernel's, another facility in ``dmesg -x``,
    a continuation (leading white space) or an empty message."""
    found = _KERNEL_PREFIX.match(line)
    assert found is not None  # every part is optional
    kmsg, pri, level = found["kmsg"], found["pri"], found["level"]
    if any(p is not None and int(p) >= 8 for p in (kmsg, pri, level)):
        return None
    tag = found["tag"]
    if tag is not None and tag != "kernel":
        return None
    facility = found["facility"]
    if facility is not None and facility != "kern":
        return None
    text = line[found.end() :]
    if not text or text[0].isspace():
        return None
    return KernelMessage(text, found["stamp"])


def without_comm(text: str) -> str:
    """An Xid line (or the rest of one after its code) without the ``name=<comm>, `` the driver
    quotes: the process's name is the user's, so it neither matches nor decodes anything. Other
    text is returned as it is."""
    start = _XID_START.match(text)
    at = start.end() if start else 0
    found = _XID_COMM.match(text, at)
    if found is None:
        return text
    return text[:at] + found.group(1) + text[found.end() :]


def reports_user_process(message: str) -> bool:
    """Whether a kernel message (from :func:`kernel_message`, with an Xid's comm cut out)
    reports a user process: a segfault, trap, general protection fault, fatal signal, an OOM
    kill or its dump, a hung task, or any user frame ``[<start>+<size>]``."""
    return bool(_USER_START.match(message) or _USER_FRAME.search(message))
