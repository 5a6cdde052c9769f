"""The signature catalogue: every entry matches the real lines failure-signatures.md quotes,
nothing matches ordinary training output, prefixes are handled, and scanning is fast."""

from __future__ import annotations

import json
import re
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest
from pydantic import ValidationError

from relaunch.detection.lines import LineBuffer, LineSplitter, lines_since
from relaunch.detection.literals import required_literals
from relaunch.detection.signatures import (
    MAX_LINE,
    Catalogue,
    Culprit,
    Role,
    ScanStats,
    Signature,
)
from relaunch.models.recovery import Category

CATALOGUE = Catalogue.load()
CATALOGUE_FILE = Path(__file__).resolve().parents[2] / "relaunch" / "detection" / "signatures.json"

TIME_LIMIT = (
    "slurmstepd: error: *** JOB 1745223 ON gpu-017 CANCELLED AT 2026-02-20T09:10:13 DUE TO "
    "TIME LIMIT ***"
)
STEPD_NODE_FAILURE = (
    "slurmstepd-n1: error: *** STEP 4.0 ON n1 CANCELLED AT 2026-02-20T09:10:13 DUE TO NODE "
    "FAILURE, SEE SLURMCTLD LOG FOR DETAILS ***"
)
WATCHDOG_TIMEOUT = (
    "5995: [rank5995]:[E202 12:25:57.436 ProcessGroupNCCL.cpp:697] Watchdog caught "
    "collective operation timeout: WorkNCCL(SeqNum=126639, OpType=COALESCED, NumelIn=10, "
    "NumelOut=20, Timeout(ms)=600000) ran for 600000 milliseconds before timing out."
)

# Lines quoted in docs/failure-signatures.md (built-from-format ones are marked there too), and
# the gloo line the local PyTorch 2.13 prints when a peer dies.
DOC_LINES = [
    ("[155044.078590] NVRM: Xid (PCI:0000:06:00): 79, GPU has fallen off the bus.", "xid_79"),
    (
        "<3>[6085126.134786] NVRM: Xid (PCI:0002:00:00): 79, pid=1582259, name=nvc:[driver], "
        "GPU has fallen off the bus.",
        "xid_79",
    ),
    (
        "NVRM: Xid (PCI:0000:07:00): 48, pid='<unknown>', name=<unknown>, An uncorrectable "
        "double bit error (DBE) has been detected on GPU in the framebuffer at physAddr "
        "0x7fdf0de80 partition 5, subpartition 1",
        "xid_48",
    ),
    (
        "NVRM: Xid (PCI:0000:10:1c): 63, pid=1896, Row Remapper: New row marked for remapping, "
        "reset gpu to activate.",
        "xid_63",
    ),
    (
        "NVRM: Xid (PCI:0003:00:00): 74, pid='<unknown>', name=<unknown>, NVLink: fatal error "
        "detected on link 14(0x0, 0x0, 0x10000, 0x0, 0x0, 0x0, 0x0)",
        "xid_74",
    ),
    (
        "kernel: NVRM: Xid (PCI:0000:17:00): 94, pid=789012, name=process, Contained ECC error.",
        "xid_94",
    ),
    (
        "NVRM: Xid (PCI:0000:01:00): 95, pid=7062, Uncontained: LTC TAG (0x2,0x0). RST: Yes, "
        "D-RST: No",
        "xid_95",
    ),
    (
        "NVRM: Xid (PCI:0000:b5:00): 13, pid='<unknown>', name=<unknown>, Graphics SM Warp "
        "Exception on (GPC 1, TPC 3, SM 0): Out Of Range Address",
        "xid_13",
    ),
    (
        "NVRM: The NVIDIA GPU 0000:0e:00.0 (PCI ID: 10de:1b06) installed in this system has "
        "fallen off the bus and is not responding to commands.",
        "nvrm_fallen_off_bus",
    ),
    (
        "[ 1108.858286] nvidia-nvswitch0: SXid (PCI:0000:c3:00.0): 24007, Fatal, Link 28 "
        "sourcetrack timeout error (First)",
        "sxid_fatal",
    ),
    (
        "mlx5_core 0000:d2:00.0: poll_health:825: device's health compromised - reached miss "
        "count.",
        "mlx5_fatal",
    ),
    (WATCHDOG_TIMEOUT, "nccl_watchdog_timeout"),
    (
        "torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/"
        "ProcessGroupNCCL.cpp:1691, unhandled system error (run with NCCL_DEBUG=INFO for "
        "details), NCCL version 2.19.3",
        "nccl_error",
    ),
    (
        "nvl72026-T11:393849:395082 [0] transport/net_ib.cc:253 NCCL WARN NET/IB : mlx5_3:1 "
        "Got non-fatal async event: port error(10)",
        "nccl_ib_async_event",
    ),
    (
        "NCCL WARN NET/IB : Got completion from peer 10.42.0.2<47534> with error 5, opcode 48, "
        "len 32764, vendor err 244",
        "nccl_ib_flushed",
    ),
    (
        "[rank0]: RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/"
        "pair.cc:553] Connection closed by peer [127.0.0.1]:8616. This is typically caused by a "
        "remote worker crashing.",
        "gloo_connection_lost",
    ),
    (
        "RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:589] Read error "
        "[192.168.70.92]:25266: Connection reset by peer",
        "gloo_connection_lost",
    ),
    (
        "[rank4717]: TCPStore recvValue failed: Failed to recv, got 0 bytes. Connection was "
        "likely closed.",
        "tcpstore_error",
    ),
    (
        "torch.distributed.DistNetworkError: Failed to recv, got 0 bytes. Connection was likely "
        "closed. Did the remote server shutdown or crash?",
        "tcpstore_error",
    ),
    (
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 146.00 MiB. GPU 0 has a "
        "total capacity of 8.00 GiB of which 0 bytes is free.",
        "cuda_oom",
    ),
    ("RuntimeError: CUDA error: uncorrectable ECC error encountered", "cuda_ecc"),
    ("RuntimeError: CUDA error: an illegal memory access was encountered", "cuda_application"),
    (
        "[rank132]: Process group watchdog thread terminated with exception: CUDA error: "
        "unspecified launch failure",
        "cuda_error",
    ),
    ("For debugging consider passing CUDA_LAUNCH_BLOCKING=1", "cuda_hint"),
    ("[rank0]: Traceback (most recent call last):", "python_traceback"),
    ("[rank0]: ValueError: batch has 3 dims, expected 4", "python_exception"),
    (
        "Memory cgroup out of memory: Killed process 41237 (python) total-vm:98765432kB, "
        "anon-rss:65432100kB, file-rss:0kB, shmem-rss:2048kB, UID:1000 pgtables:131072kB "
        "oom_score_adj:0",
        "kernel_oom_kill",
    ),
    (
        "slurmstepd: error: Detected 1 oom-kill event(s) in StepId=1742530.0. Some of your "
        "processes may have been killed by the cgroup out-of-memory handler.",
        "slurm_cgroup_oom",
    ),
    (TIME_LIMIT, "slurm_time_limit"),
    (
        "slurmstepd: error: *** STEP 1745223.0 ON gpu-017 CANCELLED AT 2026-02-20T09:10:13 DUE "
        "TO PREEMPTION ***",
        "slurm_preemption",
    ),
    (STEPD_NODE_FAILURE, "slurm_node_failure"),
    (
        "slurmstepd: error: *** STEP 1745223.0 ON gpu-017 CANCELLED AT 2026-02-20T09:10:13 ***",
        "slurm_cancelled",
    ),
    ("srun: error: node01: tasks 0-7: Exited with exit code 1", "srun_task_exit"),
    ("srun: error: Node failure on node07", "srun_node_failure"),
    ("srun: error: node01: task 0: Out Of Memory", "srun_task_oom"),
]

ORDINARY_LINES = [
    "0: step=120 loss=0.1234 rank=0 node=n1",
    "step=7 loss=2.5 rank=1 node=n2",
    "1: checkpoint saved step=100 path=/ckpt/step-100.pt",
    "0: resumed from checkpoint step=100",
    "0: [2026-02-02 12:15:29] iteration   589290/  993410 | consumed samples: 1000 |",
    "gpu-017:393849:395082 [0] NCCL INFO Channel 00/02 :    0   1",
    "[rank0]:[W1218 20:27:21.426 ProcessGroupNCCL.cpp:4561] using GPU 0 as device",
    "INFO training: epoch 3 done, no errors so far",
]


def scan_one(line: str, **kw: str) -> str | None:
    found = CATALOGUE.scan(line, source="test", **kw)
    return found[0].signature if found else None


@pytest.mark.parametrize("signature", CATALOGUE.signatures, ids=lambda s: s.id)
def test_every_entry_matches_its_examples_and_not_progress(signature: Signature) -> None:
    for example in signature.examples:
        found = CATALOGUE.scan(example, source="test", source_node="n1")
        assert found, example
        # The Xid entry names each match by its code (the Xid table decides the rest).
        expected = f"xid_{found[0].xid}" if signature.decoder == "xid" else signature.id
        assert found[0].signature == expected, example
    for line in ORDINARY_LINES:
        assert CATALOGUE.match_line(line, line_no=1, source="t") is None, line


@pytest.mark.parametrize(("line", "expected"), DOC_LINES)
def test_lines_from_the_failure_reference(line: str, expected: str) -> None:
    assert scan_one(line) == expected


def test_catalogue_covers_the_required_families() -> None:
    ids = {s.id for s in CATALOGUE.signatures}
    required = {
        "xid",
        "sxid_fatal",
        "mlx5_link_down",
        "nccl_watchdog_timeout",
        "nccl_error",
        "gloo_connection_lost",
        "tcpstore_error",
        "cuda_oom",
        "cuda_error",
        "python_traceback",
        "python_exception",
        "kernel_oom_kill",
        "slurm_time_limit",
        "slurm_preemption",
        "slurm_node_failure",
        "slurm_cancelled",
        "srun_task_exit",
    }
    assert required <= ids
    by_id = {s.id: s for s in CATALOGUE.signatures}
    assert by_id["nccl_watchdog_timeout"].role is Role.CASCADE
    assert by_id["gloo_connection_lost"].role is Role.CASCADE
    assert by_id["tcpstore_error"].role is Role.CASCADE
    assert by_id["slurm_node_failure"].role is Role.CASCADE
    assert by_id["slurm_node_failure"].culprit is Culprit.NONE  # ON <node> is the survivor
    assert by_id["srun_task_exit"].role is Role.TEARDOWN
    assert by_id["python_exception"].category is Category.APPLICATION
    assert by_id["slurm_cancelled"].category is Category.USER_CANCEL
    assert by_id["xid"].decoder == "xid"  # every Xid is read through the Xid table
    (row_remap,) = CATALOGUE.scan(DOC_LINES[3][0], source="t")
    assert row_remap.role is Role.CONTEXT  # Xid 63: informational, never an interruption cause


def test_ordinary_output_matches_nothing() -> None:
    assert CATALOGUE.scan("\n".join(ORDINARY_LINES), source="t") == []


def test_xid_number_and_source_node() -> None:
    mig = "NVRM: Xid (PCI:0000:9a:00 GPU-I:1 GPU-CI:0): 162, pid=2222, name=python3, PSHC error"
    (found,) = CATALOGUE.scan(mig, source="kern.log", source_node="n3")
    assert (found.signature, found.xid, found.host) == ("xid_162", 162, "n3")
    (found,) = CATALOGUE.scan(DOC_LINES[0][0], source="kern.log", source_node="n2")
    assert (found.xid, found.host, found.category) == (79, "n2", Category.GPU_HARDWARE)


def test_syslog_and_kernel_prefixes_are_stripped() -> None:
    line = (
        "2026-02-20T09:10:13.123456+00:00 n2 kernel: [16450076.435595] NVRM: Xid "
        "(PCI:0000:17:00): 79, pid=1, name=python, GPU has fallen off the bus."
    )
    (found,) = CATALOGUE.scan(line, source="syslog", source_node="n2")
    assert found.signature == "xid_79"
    assert found.timestamp == datetime(2026, 2, 20, 9, 10, 13, 123456, tzinfo=UTC)
    assert found.text == line  # the original line, prefixes included


def test_rank_prefixes() -> None:
    (srun,) = CATALOGUE.scan("  12: [rank12]: RuntimeError: boom", source="t")
    assert (srun.signature, srun.rank) == ("python_exception", 12)
    (torch_rank,) = CATALOGUE.scan("[rank3]: KeyError: 'labels'", source="t")
    assert torch_rank.rank == 3
    pg = (
        "[rank2]:[E1229 20:29:13.09 ProcessGroupNCCL.cpp:1484] [PG ID 0 PG GUID 0(default_pg) "
        "Rank 2] ProcessGroupNCCL's watchdog got stuck for 480 seconds without making progress"
    )
    assert CATALOGUE.scan(pg, source="t")[0].rank == 2
    assert CATALOGUE.scan("RuntimeError: boom", source="t")[0].rank is None


def test_exception_lines_are_anchored() -> None:
    """An exception name in the middle of a message is not a traceback's last line."""
    assert scan_one("INFO retrying after RuntimeError: flaky read") is None
    assert scan_one("Error: not a class name") is None
    assert scan_one("1: AssertionError") == "python_exception"


def test_hosts_from_the_line() -> None:
    exit_line = "srun: error: n[1-2]: tasks 0-1: Exited with exit code 1"
    assert CATALOGUE.scan(exit_line, source="t")[0].host == "n[1-2]"
    assert CATALOGUE.scan("srun: error: Node failure on node07", source="t")[0].host == "node07"
    nccl = (
        "[2026-02-02 12:15:29] gpu-017:393849:395082 [0] transport/net_ib/common.cc:1021 "
        "NCCL WARN NET/IB : mlx5_3:1 async fatal event: local catastrophic error"
    )
    (found,) = CATALOGUE.scan(nccl, source="t")
    assert (found.signature, found.host) == ("nccl_ib_fatal", "gpu-017")
    assert found.timestamp is not None
    assert CATALOGUE.scan(STEPD_NODE_FAILURE, source="t", source_node="n1")[0].host is None


def test_slurmstepd_time_is_the_fault_time() -> None:
    (found,) = CATALOGUE.scan(TIME_LIMIT, source="t")
    # Slurm prints local time without an offset.
    assert found.timestamp == datetime(2026, 2, 20, 9, 10, 13).astimezone(UTC)


def test_line_numbers_and_first_line_no() -> None:
    text = "step=1\nRuntimeError: x\nstep=2\nsrun: error: Node failure on n2\n"
    found = CATALOGUE.scan(text, source="job.log", first_line_no=41)
    assert [(m.line_no, m.signature) for m in found] == [
        (42, "python_exception"),
        (44, "srun_node_failure"),
    ]
    assert all(m.source == "job.log" for m in found)


def test_long_lines_are_cut() -> None:
    line = "RuntimeError: " + "x" * 2000
    assert len(CATALOGUE.scan(line, source="t")[0].text) == 500


def test_a_two_megabyte_mixed_log_finds_only_the_real_failures() -> None:
    block = [
        f"{r}: step={i} loss=0.{i % 97:04d} rank={r} node=n{r + 1}"
        for i in range(50)
        for r in range(8)
    ]
    block += [
        "gpu-017:393849:395082 [0] NCCL INFO Channel 00/02 :    0   1",
        "[rank3]:[W1218 20:27:21.426 ProcessGroupNCCL.cpp:4561] some warning about Connection ",
        "INFO loader: Exception handling is configured",
        WATCHDOG_TIMEOUT,
    ]
    text = "\n".join(block)
    while len(text) < 2_000_000:
        text += "\n" + "\n".join(block)
    found = CATALOGUE.scan(text, source="job.log")
    assert {m.signature for m in found} == {"nccl_watchdog_timeout"}
    assert len(found) == text.count("Watchdog caught collective operation timeout")


def test_load_is_cached_and_validates() -> None:
    assert Catalogue.load() is Catalogue.load()
    assert len(Catalogue.load(CATALOGUE_FILE).signatures) == len(CATALOGUE.signatures)


def _entry(**changes: object) -> dict[str, object]:
    entry: dict[str, object] = {
        "id": "demo",
        "pattern": r"GPU lost on (?P<host>\S+)",
        "category": "gpu_hardware",
        "role": "root",
        "culprit": "line_host",
        "severity": 3,
        "source": "test",
        "examples": ["GPU lost on n1"],
    }
    entry.update(changes)
    return entry


@pytest.mark.parametrize(
    "entry",
    [
        _entry(culprit="none"),  # a host group without culprit line_host
        _entry(pattern=r"GPU lost"),  # culprit line_host without a host group
        _entry(pattern=r"(?i)gpu lost on (?P<host>\S+)"),  # global flags
        _entry(pattern=r"\d+ (?P<host>\S+)"),  # nothing literal to look for
        _entry(pattern=r"GPU lost on (?P<node>\S+)", culprit="none"),  # unknown group
        _entry(category="nonsense"),
        _entry(severity=9),
        _entry(examples=[]),
    ],
)
def test_bad_entries_are_rejected(entry: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        Catalogue.from_json(json.dumps({"version": 1, "signatures": [entry]}))


def test_duplicate_ids_are_rejected() -> None:
    with pytest.raises(ValidationError, match="duplicate"):
        Catalogue.from_json(json.dumps({"version": 1, "signatures": [_entry(), _entry()]}))


def test_required_literals() -> None:
    assert required_literals(r"NVRM: Xid \(PCI:[^)]*\): (?P<xid>79)\b") == ["NVRM: Xid (PCI:"]
    assert required_literals(r"x+bcde?f|CUDA out of memory") == ["bcd", "CUDA out of memory"]
    assert required_literals(r"^(?:\w+\.)*(?:[A-Z]\w*Error|Exception)$") == ["Error", "Exception"]
    assert required_literals(r"(?i:due to) x") is None


def test_line_buffer_keeps_partial_lines_and_numbers() -> None:
    buf = LineBuffer()
    assert buf.feed(b"step=1\nstep") == [(1, "step=1")]
    assert buf.feed(b"=2\r\n\xe2\x82") == [(2, "step=2")]  # CRLF, then half a UTF-8 char
    assert buf.feed(b"\xac ok\n") == [(3, "€ ok")]
    assert buf.feed(b"tail") == []
    assert buf.next_line_no == 4


def test_line_buffer_cuts_an_endless_line_and_keeps_counting_true() -> None:
    buf = LineBuffer(first_line_no=10, max_line_bytes=8)
    assert buf.feed(b"0123456789") == [(10, "01234567")]
    assert buf.feed(b"more of line 10\nnext\n") == [(11, "next")]  # the rest is skipped
    buf.feed(b"abc")
    buf.discard_partial()
    assert buf.feed(b"def\n") == [(12, "def")]


def test_line_splitter_cuts_the_same_whatever_the_chunks() -> None:
    stream = b"short\n" + b"x" * 20 + b"\r\nok\r\n" + b"y" * 9 + b"\nend\n"
    expected = [b"short", b"x" * 8, b"ok", b"y" * 8, b"end"]
    whole = LineSplitter(max_line_bytes=8)
    assert (whole.feed(stream), whole.cut_lines) == (expected, 2)
    bytewise = LineSplitter(max_line_bytes=8)
    lines = [line for i in range(len(stream)) for line in bytewise.feed(stream[i : i + 1])]
    assert (lines, bytewise.cut_lines) == (expected, 2)


def test_scan_lines_takes_what_line_buffer_yields() -> None:
    buf = LineBuffer()
    lines = buf.feed(b"step=1\n0: RuntimeError: CUDA error: device-side assert triggered\n")
    (found,) = CATALOGUE.scan_lines(lines, source="job.log")
    assert (found.line_no, found.signature, found.rank) == (2, "cuda_application", 0)


ENGINES = ("hyperscan", "literals")


@pytest.fixture(scope="module", params=ENGINES)
def engine_catalogue(request: pytest.FixtureRequest) -> Catalogue:
    return Catalogue.load(engine=request.param)


def _mixed_log() -> str:
    lines = [example for s in CATALOGUE.signatures for example in s.examples]
    lines += [line for line, _ in DOC_LINES] + list(ORDINARY_LINES)
    lines += [f"{i % 8}: step={i} loss=0.5 rank={i % 8}" for i in range(200)]
    return "\n".join(f"{i % 3}: {line}" if i % 2 else line for i, line in enumerate(lines))


def test_both_scan_engines_find_the_same_lines(engine_catalogue: Catalogue) -> None:
    assert engine_catalogue.engine in ENGINES
    text = _mixed_log()
    expected = [
        (no, m.signature)
        for no, line in enumerate(text.split("\n"), 1)
        if (m := CATALOGUE.match_line(line, line_no=no, source="t")) is not None
    ]
    got = [(m.line_no, m.signature) for m in engine_catalogue.scan(text, source="t")]
    assert got == expected
    assert len(got) > len(CATALOGUE.signatures)


def test_scan_engines_handle_crlf_and_a_last_line_without_newline(
    engine_catalogue: Catalogue,
) -> None:
    text = "step=1\r\nValueError: bad shape\r\nstep=2\r\nsrun: error: Node failure on n2"
    found = engine_catalogue.scan(text, source="t")
    assert [(m.line_no, m.signature, m.text) for m in found] == [
        (2, "python_exception", "ValueError: bad shape"),
        (4, "srun_node_failure", "srun: error: Node failure on n2"),
    ]
    assert engine_catalogue.scan_bytes(b"", source="t") == []
    garbled = engine_catalogue.scan_bytes(
        b"x\n\xff\xfe srun: error: Node failure on n2\n", source="t"
    )
    assert [m.line_no for m in garbled] == [2]


def test_unknown_scan_engine_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown scan engine"):
        Catalogue.load(engine="grep")


# ------------------------------------------------------------------ hostile lines, linear time

ADVERSARIAL_SIZE = 32 << 10
# Per (pattern, string): a linear pattern takes under a millisecond on 32 KB; a quadratic one
# (a `.*` retried from every occurrence of its literal) takes seconds.
PER_SEARCH_BUDGET_S = 0.25
_GENERIC = [
    "mlx5_core ",
    "1",
    " ",
    ":",
    "[",
    "]",
    "[0]",
    "a:",
    "0: ",
    "a",
    "a.",
    "-",
    "=",
    "(",
    ")",
    "1:",
    "a1",
    "\t",
    ": ",
    "[1] ",
    "a:1:1 ",
    "'",
    "rank=1 ",
    "step=1 ",
]


def _adversarial(literals: list[str]) -> list[str]:
    out = [(word * (ADVERSARIAL_SIZE // len(word) + 1))[:ADVERSARIAL_SIZE] for word in _GENERIC]
    out.append("mlx5_core " * 16000 + "Segmentation fault")  # attack row 7, 160 KB
    for word in literals:
        out.append((word + " ") * (ADVERSARIAL_SIZE // (len(word) + 1)))
        out.append(word * (ADVERSARIAL_SIZE // len(word)))
        out.append((word + "x" * 40) * (ADVERSARIAL_SIZE // (len(word) + 40)))
    return out


def _every_pattern() -> list[tuple[str, re.Pattern[str]]]:
    """Every regex that runs on job-controlled text: the catalogue, the prefix and time parsers,
    progress, resume, checkpoint and straggler markers, and the bundle's mapping lines."""
    from relaunch.detection import findings, lines, markers, progress, signatures, straggler

    out = [(s.id, re.compile(s.pattern)) for s in CATALOGUE.signatures]
    out += [
        ("prefix", signatures._PREFIX),
        ("pg_rank", signatures._PG_RANK),
        ("timestamp", lines._TIMESTAMP),
        ("checkpoint", progress.CHECKPOINT_PATTERN),
        ("resume", progress.RESUME_PATTERN),
        ("progress", re.compile(progress.DEFAULT_PROGRESS_PATTERN)),
        ("megatron", re.compile(progress.MEGATRON_PROGRESS_PATTERN)),
        ("srun_label", markers._SRUN_LABEL),
        ("rank_field", progress._RANK_FIELD),
        ("node_field", progress._NODE_FIELD),
        ("straggler_label", straggler._LABEL),
        ("straggler_pg_rank", straggler._PG_RANK),
        ("seqnum", straggler._SEQNUM),
        ("step_time", straggler._STEP_TIME),
        ("nccl_address", findings._NCCL_ADDRESS),
        ("peer", findings._PEER),
        ("reporter", findings._REPORTER),
        ("torchrun_entry", findings._TORCHRUN_ENTRY),
    ]
    return out


@pytest.mark.parametrize(("name", "regex"), _every_pattern(), ids=lambda v: str(v)[:30])
def test_every_pattern_is_linear_on_hostile_lines(name: str, regex: re.Pattern[str]) -> None:
    literals = required_literals(regex.pattern) or []
    slowest, worst = 0.0, ""
    for text in _adversarial(literals):
        started = time.process_time()
        regex.search(text)
        took = time.process_time() - started
        if took > slowest:
            slowest, worst = took, text[:40]
    assert slowest < PER_SEARCH_BUDGET_S, f"{name}: {slowest:.2f}s on {worst!r}…"


def test_a_160kb_line_costs_the_scan_milliseconds_and_is_counted_as_cut() -> None:
    # Attack row 7's line, ending in a catalogue phrase 160 KB in (mlx5_fatal).
    hostile = ("mlx5_core " * 16000 + "health compromised\n").encode()
    data = hostile * 4 + b"0: RuntimeError: CUDA error: an illegal memory access\n"
    stats = ScanStats()
    started = time.process_time()
    found = CATALOGUE.scan_bytes(data, source="job_log", stats=stats)
    assert time.process_time() - started < 1.0
    # The phrase sits past the match limit: the hostile lines are matched on their first 4 KiB
    # (nothing there) and counted; the ordinary line after them matches at its own number.
    assert [(m.signature, m.line_no) for m in found] == [("cuda_error", 5)]
    assert stats.cut_lines == 4


def test_a_long_line_is_matched_on_its_start() -> None:
    line = "0: RuntimeError: CUDA error: an illegal memory access " + "x" * (MAX_LINE * 4)
    stats = ScanStats()
    (found,) = CATALOGUE.scan(line + "\n", source="job_log", stats=stats)
    assert found.signature == "cuda_error" and stats.cut_lines == 1
    assert len(found.text) <= 500


def test_many_hits_on_one_long_line_stay_linear() -> None:
    data = ("Segmentation fault " * 200_000 + "\n").encode()  # 3.8 MB, 200,000 hits
    started = time.process_time()
    CATALOGUE.scan_bytes(data, source="job_log")
    assert time.process_time() - started < 2.0


def test_lines_since_keeps_this_attempt_s_lines_and_the_unstamped_ones() -> None:
    text = (
        "2026-02-20T08:59:59Z NVRM: Xid (PCI:0000:07:00): 79, before the job\n"
        "no time on this line\n"
        "2026-02-20T09:00:00+00:00 NVRM: Xid (PCI:0000:07:00): 48, at the start\r\n"
        "2026-02-20 10:00:01Z NVRM: Xid (PCI:0000:07:00): 79, after"
    )
    start = datetime(2026, 2, 20, 9, 0, tzinfo=UTC)
    assert lines_since(text, None) == text
    kept = lines_since(text, start)
    assert kept.splitlines(keepends=True) == text.splitlines(keepends=True)[1:]
    assert lines_since("", start) == ""
