"""Kernel log lines from a file (rotation, truncation) and from journalctl's JSON output."""

from __future__ import annotations

import os
import stat
from datetime import UTC, datetime
from pathlib import Path

import pytest

from relaunch.connectors.telemetry.kernlog import (
    JournalReader,
    KernelLine,
    KernelLogError,
    KernelLogFile,
    journal_argv,
    parse_journal_entry,
    pci_in_line,
)
from relaunch.detection.signatures import Catalogue
from relaunch.workers.agent_runtime import kernel_samples

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "telemetry"
JOURNAL = (FIXTURES / "journal-kernel.json").read_bytes().splitlines()
XID_79 = "[155044.078590] NVRM: Xid (PCI:0000:06:00): 79, GPU has fallen off the bus.\n"
NOISE = "[155044.100000] usb 7-2.4: new high-speed USB device number 13 using xhci_hcd\n"


def test_file_tail_reads_appended_lines_only(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    log.write_text("[1.0] old line from before the agent started\n")
    tail = KernelLogFile(log, "gpu-node-07")
    assert tail.read() == []
    with log.open("a") as f:
        f.write(XID_79 + "[155045.0] half a li")
    assert [line.text for line in tail.read()] == [XID_79.rstrip("\n")]
    with log.open("a") as f:
        f.write("ne\n")
    assert [line.text for line in tail.read()] == ["[155045.0] half a line"]


def test_file_tail_survives_rotation_and_truncation(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    log.write_text(NOISE)
    tail = KernelLogFile(log, "gpu-node-07", from_end=True)
    with log.open("a") as f:
        f.write("[2.0] pending partial")
    assert tail.read() == []
    os.rename(log, tmp_path / "kern.log.1")  # logrotate: a new file takes the name
    log.write_text(XID_79)
    lines = tail.read()
    assert [line.text for line in lines] == [XID_79.rstrip("\n")]  # the old partial is dropped
    log.write_text("")  # copytruncate
    assert tail.read() == []
    with log.open("a") as f:
        f.write(NOISE)
    assert [line.text for line in tail.read()] == [NOISE.rstrip("\n")]


def test_journal_entries_parse_including_byte_array_messages() -> None:
    lines = [parse_journal_entry(raw, "gpu-node-07") for raw in JOURNAL]
    assert all(line is not None for line in lines)
    first, *_, last = [line for line in lines if line is not None]
    assert first.text.startswith("NVRM: Xid (PCI:0000:18:00): 79,")
    assert first.time == datetime(2026, 2, 20, 9, 0, tzinfo=UTC)
    assert first.cursor and first.cursor.startswith("s=2c2f7f3d64d844aa9bc1844a48026313;")
    assert last.text.startswith("NVRM: Xid (PCI:0000:28:00): 48,")  # MESSAGE was [78, 86, ...]
    assert last.text.endswith("\ufffd")  # the invalid byte, replaced
    assert parse_journal_entry(b"not json", "n") is None
    assert parse_journal_entry(b'{"MESSAGE": null}', "n") is None


def test_journal_argv_is_an_argv_list() -> None:
    assert journal_argv() == ["journalctl", "-k", "-o", "json", "--no-pager", "-n", "0", "-f"]
    since = datetime(2026, 2, 20, 9, 0, tzinfo=UTC)
    assert journal_argv(follow=False, since=since)[-1] == "--since=2026-02-20 09:00:00 UTC"
    assert "--after-cursor=s=1;i=2" in journal_argv(after_cursor="s=1;i=2")


def _fake_journalctl(tmp_path: Path, body: str) -> str:
    script = tmp_path / "journalctl"
    script.write_text(f'#!/bin/sh\necho "$@" > {tmp_path}/argv\n{body}\n')
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return str(script)


async def test_journal_reader_runs_journalctl_and_parses_its_output(tmp_path: Path) -> None:
    fixture = FIXTURES / "journal-kernel.json"
    reader = JournalReader("gpu-node-07", journalctl=_fake_journalctl(tmp_path, f"cat {fixture}"))
    lines = await reader.read_since(datetime(2026, 2, 20, tzinfo=UTC))
    assert len(lines) == 5
    assert (tmp_path / "argv").read_text().split()[:4] == ["-k", "-o", "json", "--no-pager"]
    assert reader.cursor == lines[-1].cursor
    followed = [line async for line in _until_error(reader)]
    assert len(followed) == 5
    assert f"--after-cursor={lines[-1].cursor}" in (tmp_path / "argv").read_text()


async def _until_error(reader: JournalReader):  # type: ignore[no-untyped-def]
    with pytest.raises(KernelLogError, match="exited with 0"):
        async for line in reader.follow():
            yield line


async def test_journalctl_failure_is_typed(tmp_path: Path) -> None:
    failing = _fake_journalctl(tmp_path, "echo 'No journal files were found.' >&2; exit 1")
    with pytest.raises(KernelLogError, match="No journal files were found"):
        await JournalReader("n1", journalctl=failing).read_since(datetime.now(UTC))
    with pytest.raises(KernelLogError, match="cannot run"):
        await JournalReader("n1", journalctl=str(tmp_path / "missing")).read_since(
            datetime.now(UTC)
        )


def test_pci_in_line() -> None:
    assert pci_in_line(XID_79) == "0000:06:00"
    assert pci_in_line("nvidia-nvswitch0: SXid (PCI:0000:c3:00.0): 24007, Fatal, x") == (
        "0000:c3:00.0"
    )
    assert pci_in_line("mlx5_core 0000:03:00.0: wait_func:1195:(pid 1): x") == "0000:03:00.0"
    assert pci_in_line(NOISE) is None


def test_catalogue_decides_which_kernel_lines_become_samples() -> None:
    lines = [parse_journal_entry(raw, "gpu-node-07") for raw in JOURNAL]
    samples = kernel_samples([line for line in lines if line], Catalogue.load())
    assert [(s.signature, s.xid, s.pci_bus_id) for s in samples] == [
        ("xid_79", 79, "0000:18:00"),
        ("sxid_fatal", None, "0000:c3:00.0"),
        ("mlx5_fatal", None, "0000:d2:00.0"),
        ("xid_48", 48, "0000:28:00"),
    ]
    assert all(s.node == "gpu-node-07" and s.source == "kernel" for s in samples)
    assert samples[0].time == datetime(2026, 2, 20, 9, 0, tzinfo=UTC)
    assert samples[0].message and samples[0].message.startswith("NVRM: Xid")


def test_kernel_line_model() -> None:
    line = KernelLine(node="n1", text=XID_79.strip())
    assert line.time is None and line.cursor is None
