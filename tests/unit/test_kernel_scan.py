"""The kernel-log scan matches only the lines its prefilter names, and reads what a line carries
from the lines before it (a piece of a record split at a newline) back from them. It must say
exactly what a reading of every line in order says: these tests hold the two side by side over
random logs of genuine driver lines, user-process reports split at their newlines, user-space
lines and noise, read whole and in pieces."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from relaunch.detection.kernel_lines import KernelLines, KernelRecord
from relaunch.detection.signatures import Catalogue, SignatureMatch

CATALOGUE = Catalogue.load()
XID = "NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=x, GPU has fallen off the bus."
STAMPS = ["[ 100.000001]", "[ 100.000002]", "[ 200.500000]", ""]
BODIES = [
    XID,
    "python3[4242]: segfault at 0 ip 00007f00 sp 00007ffc error 4 in a.so[7f00+1000]",
    "traps: python3[4242] trap invalid opcode ip:7f00 sp:7ffc error:0 in x[7f00+1000]",
    "mlx5_core 0000:3b:00.0: mlx5_health_try_recover:43:(pid 1): health recovery flow aborted",
    "audit: type=1400 apparmor=DENIED",
    "EXT4-fs (nvme0n1p1): mounted filesystem",
    "Out of memory: Killed process 77 (python3) total-vm:1kB",
]


@st.composite
def kernel_logs(draw: st.DrawFn) -> list[str]:
    lines = []
    for _ in range(draw(st.integers(0, 40))):
        stamp = draw(st.sampled_from(STAMPS))
        body = draw(st.sampled_from(BODIES))
        shape = draw(st.sampled_from(["dmesg", "syslog", "user-space", "indented"]))
        if shape == "dmesg":
            lines.append(f"{stamp} {body}".strip())
        elif shape == "syslog":
            lines.append(f"Dec  4 22:40:32 n2 kernel: {stamp} {body}".replace("  ", " ", 1))
        elif shape == "user-space":
            lines.append(f"Dec  4 22:40:32 n2 mallory: {stamp} {body}")
        else:
            lines.append(f"  {body}")
    return lines


def one_by_one(lines: list[str], record: KernelRecord) -> list[SignatureMatch]:
    """What a reading of every line in order finds (the record carried line to line)."""
    out = []
    for no, line in enumerate(lines, 1):
        found = CATALOGUE.match_line(
            line, line_no=no, source="nodes/n2.log", source_node="n2", kernel=True, record=record
        )
        if found is not None:
            out.append(found)
    return out


def key(matches: list[SignatureMatch]) -> list[tuple[int, str]]:
    return [(m.line_no, m.signature) for m in matches]


@pytest.mark.parametrize("walk", [256, 1])
@settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(logs=kernel_logs(), cut=st.integers(0, 40))
def test_the_scan_says_what_reading_every_line_says(
    walk: int, logs: list[str], cut: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(KernelLines, "WALK", walk)  # 1: the forward reading, exact too
    expected_record = KernelRecord()
    expected = one_by_one(logs, expected_record)
    # Read whole, as the evidence does, and in two reads with the record carried, as the
    # watcher's tail does.
    record = KernelRecord()
    whole = CATALOGUE.scan("\n".join(logs) + "\n", source="nodes/n2.log", source_node="n2",
                           kernel=True, record=record)  # fmt: skip
    assert key(whole) == key(expected)
    assert (record.stamp, record.user) == (expected_record.stamp, expected_record.user)
    carried = KernelRecord()
    head, tail = list(enumerate(logs, 1))[:cut], list(enumerate(logs, 1))[cut:]
    parts = CATALOGUE.scan_lines(head, source="nodes/n2.log", source_node="n2", kernel=True,
                                 record=carried)  # fmt: skip
    parts += CATALOGUE.scan_lines(tail, source="nodes/n2.log", source_node="n2", kernel=True,
                                  record=carried)  # fmt: skip
    assert key(parts) == key(expected)
    assert (carried.stamp, carried.user) == (expected_record.stamp, expected_record.user)


def test_a_piece_of_a_split_segfault_report_is_no_xid_whichever_way_it_is_read() -> None:
    report = [
        "[ 100.000001] python3[4242]: segfault at 0 ip 00007f00 sp 00007ffc error 4 in a",
        f"[ 100.000001] {XID}",  # the file name's second line, with the report's stamp
        "[ 100.000001] [7f00+1000]",
    ]
    log = [*report, f"[ 100.000009] {XID}"]  # a genuine Xid after it
    found = CATALOGUE.scan("\n".join(log) + "\n", source="n", source_node="n2", kernel=True)
    assert key(found) == [(1, "kernel_segfault"), (4, "xid_79")]
    # Read in two pieces, the report's first line in the first: the record carries it.
    record = KernelRecord()
    first = CATALOGUE.scan(report[0] + "\n", source="n", source_node="n2", kernel=True,
                           record=record)  # fmt: skip
    rest = CATALOGUE.scan("\n".join(log[1:]) + "\n", source="n", source_node="n2",
                          kernel=True, record=record, first_line_no=2)  # fmt: skip
    assert key(first + rest) == [(1, "kernel_segfault"), (4, "xid_79")]
