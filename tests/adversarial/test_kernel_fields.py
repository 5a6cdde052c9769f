"""Issue 29 row 1 on the real stack: the kernel log quotes text a user chooses.

As the non-root ``relaunch-mallory``, a job runs code mapped from a file it named like NVIDIA's
Xid 79 line, and the code faults (``mov rax, [0]``): this machine's kernel prints its own
segfault report, quoting the file's name (arch/x86/mm/fault.c ``show_signal_msg``, mm/memory.c
``print_vma_addr``). A second file's name holds newlines, which the kernel's syslog(2)
interface (``/proc/kmsg``, what rsyslog's imklog reads; ``dmesg -S``) splits into lines of their
own, each with the record's prefix: one of them is a bare Xid 79 line. The test reads both
reports back from the kernel (``/dev/kmsg`` and ``dmesg -S``), appends them to the node's
kernel-log file as rsyslog would, with two user-space syslog lines carrying the same Xid text
(the shape a central rsyslog writes for ``logger``): the job's recovery drains nothing,
corroborates nothing on the kernel log's word and charges no reputation. Then, as the control,
a genuine Xid 79 in the canary's kernel log, with a job printing fake Xid lines and user-space
Xid lines around it, is still caught and drained (the one-node guard was not spent)."""

from __future__ import annotations

import asyncio
import json
import os
import pwd
import re
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

from relaunch.devstack import faults
from relaunch.models.recovery import Action
from tests.adversarial.hostile import Tier

CANARY = "n1"
NODE = "n3"
XID79 = "NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus."
NAMES = [XID79, f"x\n{XID79}\ny"]  # no '/' in a file name; a newline is allowed
FAULT = r"""
import ctypes, os, subprocess, sys

def fault(path):
    with open(path, "wb") as fh:  # mov rax, [0]; ret
        fh.write(b"\x48\x8b\x04\x25\x00\x00\x00\x00\xc3".ljust(4096, b"\x00"))
    libc = ctypes.CDLL(None)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                          ctypes.c_int, ctypes.c_long]
    fd = os.open(path, os.O_RDONLY)
    addr = libc.mmap(None, 4096, 1 | 4, 2, fd, 0)  # PROT_READ|PROT_EXEC, MAP_PRIVATE
    ctypes.CFUNCTYPE(None)(addr)()

if sys.argv[1] == "--child":
    fault(sys.argv[2])
else:
    for name in sys.argv[2:]:
        child = subprocess.Popen([sys.executable, __file__, "--child",
                                  os.path.join(sys.argv[1], name)])
        print(f"faulted pid={child.pid} rc={child.wait()}", flush=True)
"""
FAKE_XID = (
    'echo "[ 8123.456789] NVRM: Xid (PCI:0000:3b:00): 79, pid=4242, name=python3, '
    'GPU has fallen off the bus."'
)


def stamp() -> str:
    return datetime.now(UTC).isoformat(timespec="microseconds")


def kmsg_record(pid: int) -> tuple[int, int, str]:
    """The kernel's segfault report of ``pid`` as /dev/kmsg gives it: (facility, its time in
    microseconds since boot, message)."""
    fd = os.open("/dev/kmsg", os.O_RDONLY | os.O_NONBLOCK)
    try:
        while True:
            try:
                record = os.read(fd, 8192).decode("utf-8", errors="replace")
            except BlockingIOError:
                raise AssertionError(f"no segfault report of pid {pid} in /dev/kmsg") from None
            except BrokenPipeError:  # overwritten while read: go on
                continue
            head, _, message = record.partition(";")
            if f"[{pid}]: segfault at " in message:
                fields = head.split(",")
                return int(fields[0]) >> 3, int(fields[2]), message.split("\n")[0]
    finally:
        os.close(fd)


def syslog_pieces(pid: int) -> list[str]:
    """The same record through the syslog(2) interface (``dmesg -S``, as /proc/kmsg gives it to
    rsyslog's imklog): one line per piece of its text, each with the record's stamp."""
    out = subprocess.run(
        ["dmesg", "-S"], capture_output=True, text=True, timeout=30, check=True
    ).stdout.splitlines()
    first = next(i for i, line in enumerate(out) if f"[{pid}]: segfault at " in line)
    record_stamp = out[first].split("]")[0] + "]"
    pieces = [out[first]]
    for line in out[first + 1 :]:
        if not line.startswith(record_stamp):
            break
        pieces.append(line)
    return pieces


def reputation(t: Tier) -> dict[str, int]:
    nodes = subprocess.run(
        [sys.executable, "-m", "relaunch.cli", "nodes", "--json", "--config", str(t.h.config_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert nodes.returncode == 0, nodes.stderr
    return {r["node"]: r["incidents"] for r in map(json.loads, nodes.stdout.splitlines())}


async def test_the_kernels_own_segfault_line_naming_an_xid_file_drains_nothing(
    arena: Tier,
) -> None:
    t = arena
    script_path = t.home / "fault.py"
    script_path.write_text(FAULT)
    os.chown(script_path, t.user.pw_uid, t.user.pw_gid)
    names = " ".join("$'" + n.replace("\n", "\\n") + "'" for n in NAMES)
    job_id = t.submit(
        f"#!/bin/bash\n/usr/bin/python3 {script_path} {t.home} {names}\nexec sleep 900\n",
        "-w",
        NODE,
        "-n1",
    )
    await t.running(job_id)
    deadline = time.monotonic() + 60
    while len(pids := re.findall(r"faulted pid=(\d+) rc=-11", t.log(job_id))) < 2:
        assert time.monotonic() < deadline, f"the job's code did not fault: {t.log(job_id)!r}"
        await asyncio.sleep(0.3)
    facility, usec, single = kmsg_record(int(pids[0]))
    assert facility == 0, "the report is the kernel's own (facility 0)"
    assert f"in {XID79}[" in single, single  # the kernel quotes the file's name
    pieces = syslog_pieces(int(pids[1]))
    assert pieces[1].endswith(XID79), pieces  # a bare Xid 79 line, stamped by the kernel
    print(f"the kernel's report: {single}\nsplit by syslog(2): {pieces}")

    await asyncio.sleep(1.5)  # the watcher has looked at the node's log for this job
    kernel_time = f"[{usec / 1e6:12.6f}]"
    t.write_kernel(
        NODE,
        f"{stamp()} {NODE} kernel: {kernel_time} {single}\n"
        + "".join(f"{stamp()} {NODE} kernel: {piece}\n" for piece in pieces)
        + f"{stamp()} {NODE} mallory: {XID79}\n"
        + f"{stamp()} {NODE} python3[{pids[0]}]: {XID79}\n",
    )
    status = await t.settled(await t.incident(job_id), timeout=180)
    t.say("29.1", status)
    verdict, plan = status.verdict, status.plan
    assert verdict is not None and plan is not None, status
    assert plan.drain_nodes == [] and plan.action is not Action.ISOLATE_AND_RESTART, plan
    assert "kernel_log" not in verdict.corroboration.get(NODE, []), verdict.corroboration
    assert t.drained() == {}, t.drained()
    # The kernel's line was read, as what it is: a report about the job's own process.
    trusted = {(e.signature, e.source) for e in verdict.evidence if e.trusted}
    assert ("kernel_segfault", f"nodes/{NODE}.log") in trusted, verdict.evidence
    assert not any(e.xid for e in verdict.evidence if e.trusted), verdict.evidence
    assert reputation(t).get(NODE, 0) == 0

    await genuine_xid_with_noise_is_drained(t)


async def genuine_xid_with_noise_is_drained(t: Tier) -> None:
    """The control: a bystander's job on the canary prints fake Xid lines the moment a genuine
    Xid 79 reaches the canary's kernel log between two user-space Xid lines; the recovery
    names the canary on the kernel log's word and drains it (the guard of one node is free)."""
    trigger = t.h.tmp / "bystander" / "noise"
    trigger.parent.mkdir(exist_ok=True)
    noisy = (
        "#!/bin/bash\necho ready\n"
        f"while [ ! -e {trigger} ]; do sleep 0.1; done\n"
        f"for i in 1 2 3 4 5; do {FAKE_XID}; sleep 0.2; done\nexec sleep 900\n"
    )
    job_id = t.submit(noisy, "-w", CANARY, "-n1", user=pwd.getpwuid(0))
    await wait_printed(t, job_id, "ready", t.h.tmp / "bystander")
    await asyncio.sleep(1.5)
    t.write_kernel(
        CANARY,
        f"{stamp()} {CANARY} mallory: {XID79}\n"
        + faults.xid79_line(CANARY)
        + f"{stamp()} {CANARY} mallory: {XID79}\n",
    )
    trigger.touch()
    incident = await t.inject_until_detected(CANARY, job_id, timeout=90)
    status = await t.settled(incident, timeout=180)
    t.say("29.1 control", status)
    verdict = status.verdict
    assert verdict is not None, status
    assert verdict.culprit_nodes == [CANARY], verdict
    assert "kernel_log" in verdict.corroboration.get(CANARY, []), verdict.corroboration
    await t.h.until(
        lambda: t.drained_by(CANARY, incident), f"{CANARY} drained for {incident}", timeout=120
    )
    assert set(t.drained()) == {CANARY}
    t.alive()


async def wait_printed(t: Tier, job_id: str, text: str, home: Path, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while text not in t.log(job_id, home):
        assert time.monotonic() < deadline, f"job {job_id} never printed {text!r}"
        await asyncio.sleep(0.2)
