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
# A stack frame as the kernel prints it (%pS): `[<address>] ` before 4.x's function, `? ` for
# an unreliable frame, ` [module]` (since 5.x `[module buildid]`) for code outside vmlinux.
_FRAME = re.compile(
    r"\s{0,8}(?:\[<[0-9a-f]{8,16}>\] ?)?(?:\? )?"
    r"(?P<fn>[A-Za-z_.$][\w.$]{0,127})\+0x[0-9a-f]{1,8}/0x[0-9a-f]{1,8}"
    r"(?: \[(?P<mod>\w{1,64})(?: [0-9a-f]{1,64})?\])?\s{0,4}"
)


@dataclass(frozen=True)
class KernelMessage:
    """A kernel line's message (from its first character) and the kernel's own stamp, if any."""

    text: str
    stamp: str | None


@dataclass(frozen=True)
class KernelFrame:
    """One frame of a stack the kernel printed: the function, its module (None: built in) and
    the line's kernel stamp."""

    function: str
    module: str | None
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
    found = _kernel_text(line)
    if found is None or found.text[0].isspace():
        return None
    return found


def kernel_frame(line: str) -> KernelFrame | None:
    """A stack frame the kernel printed (a hung task's or an oops' ``Call Trace:`` lines:
    ``[<ffffffffc05523b4>] llog_process+0x14/0x20 [obdclass]`` up to 4.x, `` ? nfs_x+0x1/0x2
    [nfs]`` since), on a line that is the kernel's, or None. The whole line must be the frame:
    a function, its offset and size, and the module it lives in, all written by the kernel
    (``%pS``); a user's text cannot add one (a comm is 15 bytes, shorter than any frame)."""
    found = _kernel_text(line)
    if found is None:
        return None
    frame = _FRAME.fullmatch(found.text)
    if frame is None:
        return None
    return KernelFrame(frame["fn"], frame["mod"], found.stamp)


def _kernel_text(line: str) -> KernelMessage | None:
    """The text after the kernel's own prefix (possibly starting with white space), or None
    when the line is not the kernel's or holds nothing."""
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
    if not text or text.isspace():
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


class KernelLines:
    """One read of a kernel log (its bytes), each line parsed only when asked for, so that a
    scan matches just the lines its prefilter names and still knows what each carries from the
    lines before it (:class:`KernelRecord`): read back over the run of lines with the same
    stamp, or, past :attr:`WALK` lines, by reading forward from the start (exact either way).
    Lines are cut at ``limit`` bytes, as the scan cuts them."""

    WALK = 256

    def __init__(self, data: bytes, limit: int) -> None:
        self._data = data
        self._limit = limit
        self._parsed: dict[int, tuple[str | None, bool] | None] = {}
        self._forward: tuple[int, KernelRecord] | None = None

    def _at(self, start: int, end: int) -> tuple[str | None, bool] | None:
        """The stamp of the line at ``start:end`` and whether it reports a user process; None
        when it is no kernel message."""
        if start not in self._parsed:
            raw = self._data[start : min(end, start + self._limit)]
            msg = kernel_message(raw.decode("utf-8", errors="replace").removesuffix("\r"))
            self._parsed[start] = (
                None if msg is None else (msg.stamp, reports_user_process(without_comm(msg.text)))
            )
        return self._parsed[start]

    def end(self) -> int:
        """Where a line after the last one would start."""
        data = self._data
        return len(data) if not data or data.endswith(b"\n") else len(data) + 1

    def record_before(self, start: int, carried: KernelRecord) -> KernelRecord:
        """The record a line-by-line reading holds just before the line that starts at byte
        ``start`` (``carried``: what the previous read of the log left)."""
        stamp: str | None = None
        seen = False
        end = start - 1  # the newline that ends the line before
        steps = 0
        while end >= 0:
            if steps >= self.WALK:
                return self._forward_to(start, carried)
            steps += 1
            line_start = self._data.rfind(b"\n", 0, end) + 1
            at = self._at(line_start, end)
            end = line_start - 1
            if at is None:
                continue  # no kernel message: a reading line by line passes it by
            line_stamp, user = at
            if not seen:
                seen, stamp = True, line_stamp
            elif line_stamp != stamp:
                return KernelRecord(stamp, False)
            if user:
                return KernelRecord(stamp, True)
            if stamp is None:
                return KernelRecord(None, False)
        if not seen:
            return KernelRecord(carried.stamp, carried.user)
        return KernelRecord(stamp, stamp is not None and carried.stamp == stamp and carried.user)

    def _forward_to(self, start: int, carried: KernelRecord) -> KernelRecord:
        pos, state = self._forward or (0, KernelRecord(carried.stamp, carried.user))
        if start < pos:
            pos, state = 0, KernelRecord(carried.stamp, carried.user)
        data = self._data
        while pos < start and pos <= len(data):
            end = data.find(b"\n", pos)
            end = len(data) if end == -1 else end
            at = self._at(pos, end)
            pos = end + 1
            if at is None:
                continue
            line_stamp, user = at
            chained = line_stamp is not None and line_stamp == state.stamp and state.user
            state = KernelRecord(line_stamp, user or chained)
        self._forward = (pos, state)
        return KernelRecord(state.stamp, state.user)
