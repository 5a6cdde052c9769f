"""Issue 29 row 1, and row 9's operator-configured files (at the end). The kernel log quotes text a
user chooses: a node's kernel log convicts a node only where the driver writes, at the message
start after the kernel's own prefix, on a line of the kernel's (not a user-space syslog line),
never on a line that reports a user process, and an Xid's quoted comm never steers its decode.
Each attack below drained the node before (a verdict of isolate_and_restart, corroborated by
`kernel_log`); the controls show that a genuine Xid 79 still drains in every shape a kernel log
is kept in.

The segfault lines are the kernel's own, read back from ``dmesg`` on this machine's kernel
(6.18; arch/x86/mm/fault.c ``show_signal_msg`` and mm/memory.c ``print_vma_addr``) after a
process ran code mapped from a file named like an Xid line (see
tests/adversarial/test_kernel_fields.py, which produces them on the real stack)."""

from __future__ import annotations

import asyncio
import os
from datetime import UTC, datetime
from pathlib import Path

import pytest

from relaunch.connectors.joboutput import FileEvidence, read_file_evidence
from relaunch.connectors.logs import FileTail
from relaunch.connectors.telemetry.kernlog import KernelLine
from relaunch.console.auth import ConsoleRole, TokensFileError, TokenStore, write_tokens
from relaunch.detection.attribution import attribute_bundle
from relaunch.detection.signatures import Catalogue, Signature
from relaunch.models.bundle import Bundle, BundleJob
from relaunch.models.config import JobOutputSettings
from relaunch.models.recovery import Action, Verdict
from relaunch.models.scheduler import Job
from relaunch.workers.agent_runtime import kernel_samples

NODES = ["n1", "n2", "n3"]
T0 = datetime(2026, 12, 3, 9, 0, tzinfo=UTC)
XID79 = "NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus."
# The kernel's segfault report for code run from a file named XID79 (`dmesg`, this kernel).
SEGFAULT = (
    "python3[9261]: segfault at 0 ip 00007f914daec000 sp 00007ffc42092478 error 4 in "
    f"{XID79}[0,7f914daec000+1000] likely on CPU 1 (core 1, socket 0)"
)
# The same report when the file name holds newlines, as the syslog(2) interface (/proc/kmsg,
# rsyslog's imklog, `dmesg -S`) gives it: one line per piece, each with the record's prefix.
SPLIT = [
    "<6>[  405.538794] python3[9263]: segfault at 0 ip 00007f18e4217000 sp 00007ffdd72443f8 "
    "error 4 in x",
    f"<6>[  405.538794] {XID79}",
    "<6>[  405.538794] y[0,7f18e4217000+1000] likely on CPU 1 (core 1, socket 0)",
    "<6>[  405.538810] Code: Unable to access opcode bytes at 0x7f18e4216fd6.",
]
SYSLOG = "2026-12-03T09:04:00.123456+00:00 n2 kernel: "


def verdict(node_log: str) -> Verdict:
    """The verdict on a job whose rank on n2 exited, with ``node_log`` as n2's kernel log."""
    job = BundleJob(
        cluster="c",
        job_id="77",
        state="FAILED",
        nodes=NODES,
        node_states=dict.fromkeys(NODES, "ALLOCATED"),
        observed_at=T0.replace(minute=5),
        submit_time=T0,
    )
    bundle = Bundle(
        path="mem",
        job=job,
        job_log="srun: error: n2: task 1: Exited with exit code 1\n",
        node_logs={"n2": node_log.rstrip("\n") + "\n"},
    )
    return attribute_bundle(bundle)


def drains(node_log: str) -> bool:
    v = verdict(node_log)
    return v.action is Action.ISOLATE_AND_RESTART and "n2" in v.culprit_nodes


def convicted(v: Verdict) -> bool:
    """Whether n2's kernel log convicts it (the corroboration a drain needs)."""
    return "kernel_log" in v.corroboration.get("n2", [])


@pytest.mark.parametrize(
    "line",
    [
        pytest.param(f"[  405.521234] {SEGFAULT}", id="dmesg"),
        pytest.param(f"6,339,405521234,-;{SEGFAULT}", id="dev-kmsg"),
        pytest.param(f"{SYSLOG}[  405.521234] {SEGFAULT}", id="rsyslog"),
        pytest.param(f"Dec 03 09:04:00 n2 kernel: {SEGFAULT}", id="journalctl-k"),
    ],
)
def test_the_kernels_segfault_report_naming_an_xid_file_drains_nothing(line: str) -> None:
    v = verdict(line)
    assert not drains(line), v
    assert not convicted(v), v.corroboration


@pytest.mark.parametrize(
    "quoted",
    [
        "nvidia-nvswitch0: SXid (PCI:0000:c3:00.0): 24007, Fatal, Link 28 timeout",
        "mlx5_core 0000:d2:00.0: poll_health:825: device's health compromised",
        "mlx5_core: INFO: synd 0x8: unrecoverable hardware error.",
        "NVRM: GPU 0000:9a:00.0: RmInitAdapter failed! (0x22:0x40:894)",
        "NVRM: The NVIDIA GPU 0000:0e:00.0 (PCI ID: 10de:1b06) has fallen off the bus.",
    ],
)
def test_a_user_frame_quoting_any_driver_text_drains_nothing(quoted: str) -> None:
    """SXid, mlx5, RmInitAdapter and fallen-off-the-bus text in a user frame (` in <file>[...]`
    of a segfault or trap report)."""
    for report in (
        f"python3[1]: segfault at 0 ip 00007f0000000000 sp 00007ffc00000000 error 4 in {quoted}"
        "[0,7f0000000000+1000] likely on CPU 1 (core 1, socket 0)",
        f"traps: python3[1] trap invalid opcode ip:7f0000000000 sp:7ffc00000000 error:0 in "
        f"{quoted}[7f0000000000+1000]",
    ):
        assert not drains(f"{SYSLOG}{report}"), report


@pytest.mark.parametrize(
    "line",
    [
        # comm (15 characters) imitates the driver at the message start
        "NVRM: Xid (PCI:[9261]: segfault at 0 ip 00007f914daec000 sp 00007ffc42092478 error 4 "
        "in NVRM: fallen off the bus[0,7f914daec000+1000]",
        "NVRM: fallen of[77]: segfault at 0 ip 00007f914daec000 sp 00007ffc42092478 error 4 "
        "in fallen off the bus[0,7f914daec000+1000]",
        # a general protection fault and a fatal signal's report
        f"python3[1] general protection fault ip:7f sp:7ff error:0 in {XID79}[7f+1000]",
        # a driver line that quotes a user's string (the client's RM API version)
        "NVRM: API mismatch: the client has the version fallen off the bus, but",
    ],
    ids=["comm-xid", "comm-fallen", "general-protection", "api-mismatch"],
)
def test_user_text_at_or_after_the_message_start_drains_nothing(line: str) -> None:
    assert not drains(f"{SYSLOG}{line}"), line


@pytest.mark.parametrize(
    "line",
    [
        pytest.param(f"2026-12-03T09:04:00.123456+00:00 n2 mallory: {XID79}", id="logger-tag"),
        pytest.param(f"Dec  3 09:04:00 n2 kernel[4242]: {XID79}", id="kernel-with-pid"),
        pytest.param(f"14,340,405521645,-;{XID79}", id="dev-kmsg-user-facility"),
        pytest.param(f"<14>[  405.521645] {XID79}", id="dmesg-r-user-facility"),
        pytest.param(f"user  :info  : [  405.521645] {XID79}", id="dmesg-x-user-facility"),
    ],
)
def test_a_user_space_line_in_the_kernel_log_drains_nothing(line: str) -> None:
    assert not drains(line), line


def test_a_record_split_at_its_newlines_drains_nothing_and_a_real_xid_after_it_does() -> None:
    """A file name with newlines splits the kernel's segfault record into lines of their own
    under /proc/kmsg (rsyslog's imklog) and `dmesg -S`: the middle piece is a bare Xid line
    with the record's stamp. `dmesg` indents the pieces instead."""
    assert not drains("\n".join(SPLIT))
    indented = [SPLIT[0].removeprefix("<6>"), f"                  {XID79}"]
    assert not drains("\n".join(indented))
    genuine = f"<3>[  406.000001] {XID79}"
    assert drains("\n".join([*SPLIT, genuine]))


def test_the_agent_forwards_no_xid_from_a_user_process_report() -> None:
    """The node agent's kernel reader (its samples become trusted telemetry)."""
    catalogue = Catalogue.load()
    fake = [KernelLine(node="n2", text=text) for text in (*SPLIT, f"[ 405.5] {SEGFAULT}")]
    assert [s.xid for s in kernel_samples(fake, catalogue) if s.xid is not None] == []
    real = kernel_samples([KernelLine(node="n2", text=f"[ 406.0] {XID79}")], catalogue)
    assert [s.xid for s in real] == [79]


def test_an_xid_comm_does_not_steer_the_decode() -> None:
    """`name=<comm>` is the process's name: a comm that reads like a recovery action or NVLink
    registers neither makes a drain nor hides one."""
    head = f"{SYSLOG}NVRM: Xid (PCI:0000:3b:00): "
    harmless = "154, pid=1, name=to 0x2, GPU recovery action changed from 0x0 (None) to 0x0 (None)"
    assert not drains(head + harmless)
    serious = (
        "154, pid=1, name=to 0x0 (None), GPU recovery action changed from 0x0 (None) to 0x2 "
        "(Node Reboot Required)"
    )
    assert drains(head + serious)
    ignorable = (
        "74, pid=1, name=link 1(0x10), NVLink: fatal error detected on link 14(0x1, 0x0, 0x0, "
        "0x0, 0x0, 0x0, 0x0)"
    )
    assert not drains(head + ignorable)
    # /dev/kmsg prints a comm's control bytes as `\xNN`: still at most 15 bytes of comm.
    escaped = "3,339,405521234,-;NVRM: Xid (PCI:0000:3b:00): " + harmless.replace(
        "to 0x2,", "to 0x2\\x01\\x02,"
    )
    assert "\\x01" in escaped and not drains(escaped)


@pytest.mark.parametrize(
    "line",
    [
        f"[  405.521234] {XID79}",
        f"[  405.521234][ T2590] {XID79}",
        f"<3>[  405.521234] {XID79}",
        f"[Thu Dec  3 09:04:00 2026] {XID79}",
        f"kern  :err   : [  405.521234] {XID79}",
        f"3,339,405521234,-;{XID79}",
        f"Dec 03 09:04:00 n2 kernel: {XID79}",
        f"2026-12-03T09:04:00+0000 n2 kernel: {XID79}",
        f"{SYSLOG}[  405.521234] {XID79}",
        f"kernel: {XID79}",
        XID79,
        f"{SYSLOG}NVRM: Xid (PCI:0000:3b:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen "
        "off the bus.",
    ],
)
def test_control_a_genuine_xid_79_drains_in_every_kernel_log_shape(line: str) -> None:
    """Controls (these passed before too): dmesg, its caller id, -r, -T, -x, /dev/kmsg,
    journalctl -k (short, short-iso), rsyslog, bare."""
    v = verdict(line)
    assert drains(line), v
    assert convicted(v), v.corroboration


def test_a_genuine_xid_79_in_dmesg_iso_time_drains() -> None:
    """`dmesg --time-format iso` (a comma before the fraction) was not read before."""
    assert drains(f"2026-12-03T09:04:00,123456+00:00 {XID79}")


def test_control_a_genuine_xid_79_with_job_written_noise_around_it_drains() -> None:
    """Fake lines around the real one (a user-space syslog line, a segfault report naming an
    Xid file) take nothing from it."""
    log = "\n".join(
        [
            f"2026-12-03T09:03:59.000000+00:00 n2 mallory: {XID79}",
            f"{SYSLOG}[  405.521234] {SEGFAULT}",
            f"{SYSLOG}[  405.600000] {XID79}",
            f"2026-12-03T09:04:01.000000+00:00 n2 mallory: {XID79}",
        ]
    )
    v = verdict(log)
    assert drains(log), v
    assert convicted(v), v.corroboration


def test_every_kernel_entry_reads_its_examples_at_the_message_start() -> None:
    """The catalogue's kernel patterns still read the reference lines they were written for."""
    catalogue = Catalogue.load()
    entries = [s for s in catalogue.signatures if s.kernel is not None]
    assert {s.id for s in entries} >= {"xid", "nvrm_fallen_off_bus", "sxid_fatal", "mlx5_fatal"}
    for entry in entries:
        for example in entry.examples:
            m = catalogue.match_line(example, line_no=1, source="kernel", kernel=True)
            assert m is not None, (entry.id, example)
            assert m.signature == entry.id or entry.decoder == "xid", (entry.id, m.signature)


def test_a_hardware_kernel_pattern_must_start_with_the_drivers_words() -> None:
    bad = {
        "id": "loose",
        "pattern": "fallen off the bus",
        "kernel": ".*fallen off the bus",
        "category": "gpu_hardware",
        "role": "root",
        "culprit": "source_node",
        "severity": 5,
        "source": "test",
        "examples": ["NVRM: fallen off the bus"],
    }
    with pytest.raises(ValueError, match="starts with the driver's words"):
        Signature.model_validate(bad)


# ------------------------------------------------- row 9: operator-configured files, their owner

ORDINARY_UID = 54321  # above UID_MIN: an ordinary user's (no account is needed to own a file)
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="giving a file away needs root")


def node_evidence(pattern: str) -> FileEvidence:
    job = Job(job_id="7", user="root", user_id=0, group_id=0, nodes=["n2"])
    return asyncio.run(
        read_file_evidence(
            job,
            start=0,
            node_log_pattern=pattern,
            settings=JobOutputSettings(),
            log_limit=1 << 20,
            node_log_limit=1 << 20,
        )
    )


@needs_root
@pytest.mark.parametrize("how", ["owner", "mode", "directory"])
def test_a_node_log_an_ordinary_user_could_write_is_refused(tmp_path: Path, how: str) -> None:
    """A kernel log that a user owns, that anyone may write, or whose directory a user owns
    (so that the file could be swapped) is not the kernel's word: never read, and said."""
    folder = tmp_path / "logs"
    folder.mkdir()
    log = folder / "n2.log"
    log.write_text(f"[  405.5] {XID79}\n")
    log.chmod(0o644)
    if how == "owner":
        os.chown(log, ORDINARY_UID, 0)
    elif how == "mode":
        log.chmod(0o666)
    else:
        os.chown(folder, ORDINARY_UID, 0)
    files = node_evidence(str(folder / "{node}.log"))
    assert files.node_logs == {}, files.node_logs
    reason = files.refused_paths[str(log)]
    assert "trusted evidence" in reason, reason
    tail = FileTail(log)  # the watcher's and the agent's tail
    assert tail.read() == b"" and tail.refused == reason


@needs_root
def test_control_a_root_owned_node_log_is_read(tmp_path: Path) -> None:
    log = tmp_path / "n2.log"
    log.write_text(f"[  405.5] {XID79}\n")
    log.chmod(0o644)
    files = node_evidence(str(tmp_path / "{node}.log"))
    assert XID79 in files.node_logs["n2"] and files.refused_paths == {}


@needs_root
def test_a_tokens_file_an_ordinary_user_could_write_is_refused(tmp_path: Path) -> None:
    """Whoever may write the tokens file may give themselves any role."""
    tokens = tmp_path / "tokens.json"
    write_tokens(tokens, [("vera", ConsoleRole.VIEWER)])
    os.chown(tokens, ORDINARY_UID, 0)
    with pytest.raises(TokensFileError, match="refusing the console tokens file"):
        TokenStore(tokens)
