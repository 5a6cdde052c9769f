"""Hostile and random input to the scanner, attribution, progress tracking and hostlists.

Everything a job prints is under its user's control. These tests feed the code adversarial
examples (the attack table's rows 4, 7 and 8) and random lines, hostlists and whole bundles
(hypothesis), each under a time budget (CPU seconds) and a memory limit (tracemalloc's peak,
and RLIMIT_AS in a child process): no crash, no timeout, no unbounded memory.
"""

from __future__ import annotations

import subprocess
import sys
import time
import tracemalloc
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TypeVar

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from relaunch.connectors.bundles import INLINE_LOG_BYTES, read_bundle, write_bundle
from relaunch.detection.attribution import attribute_bundle
from relaunch.detection.findings import MAX_KEPT_PER_SIGNATURE, collect
from relaunch.detection.literals import required_literals
from relaunch.detection.progress import ProgressTracker
from relaunch.detection.signatures import Catalogue
from relaunch.models.bundle import Bundle, BundleJob
from relaunch.models.errors import InvalidNameError
from relaunch.models.hostlist import DEFAULT_MAX_HOSTS, count, expand
from relaunch.models.recovery import Category

CATALOGUE = Catalogue.load()
NODES = ["n1", "n2", "n3", "n4"]
T = datetime(2026, 11, 30, 10, 0, tzinfo=UTC)
XID_79_N2 = f"{T + timedelta(minutes=2):%Y-%m-%dT%H:%M:%S}+00:00 n2 kernel: NVRM: Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen off the bus.\n"  # noqa: E501
# Per input: CPU seconds and bytes Python may allocate at the peak.
TIME_BUDGET_S = 2.0
MEMORY_BUDGET = 64 << 20

R = TypeVar("R")


def bounded(run: Callable[[], R]) -> R:
    """Run ``run`` and fail when it takes more than the time budget or peaks above the
    memory budget."""
    tracemalloc.start()
    started = time.process_time()
    try:
        result = run()
        took = time.process_time() - started
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert took < TIME_BUDGET_S, f"took {took:.2f} CPU-s"
    assert peak < MEMORY_BUDGET, f"peaked at {peak / 1e6:.0f} MB"
    return result


def job(**changes: object) -> BundleJob:
    fields: dict[str, object] = {
        "cluster": "c",
        "job_id": "7",
        "state": "FAILED",
        "nodes": NODES,
        "observed_at": T + timedelta(minutes=30),
        "submit_time": T - timedelta(minutes=5),
    }
    fields.update(changes)
    return BundleJob.model_validate(fields)


def bundle(log: str, node_logs: dict[str, str] | None = None, **changes: object) -> Bundle:
    return Bundle(path="mem", job=job(**changes), job_log=log, node_logs=node_logs or {})


# --------------------------------------------------------------------- the attack table's rows


def test_row_4_a_billion_host_hostlist_is_refused_everywhere_in_a_memory_limited_process() -> None:
    # Run in a child whose address space is capped after its imports: an expansion that
    # allocated per host would die with MemoryError there.
    code = """
import resource, sys
from relaunch.detection.attribution import attribute_bundle
from relaunch.detection.findings import normalise_host
from relaunch.detection.signatures import Catalogue
from relaunch.models import hostlist
from relaunch.models.bundle import Bundle, BundleJob
from relaunch.models.errors import InvalidNameError
catalogue = Catalogue.load()
soft, hard = resource.getrlimit(resource.RLIMIT_AS)
used = int(open("/proc/self/statm").read().split()[0]) * resource.getpagesize()
resource.setrlimit(resource.RLIMIT_AS, (used + (256 << 20), hard))
line = "srun: error: Node failure on a[0-999][0-999][0-999]"
try:
    hostlist.expand("a[0-999][0-999][0-999]")
    sys.exit("expanded")
except InvalidNameError:
    pass
assert normalise_host("a[0-999][0-999][0-999]", ["n1", "n2"]) == []
job = BundleJob(cluster="c", job_id="1", state="FAILED", nodes=["n1", "n2"],
                observed_at="2026-11-30T10:00:00Z")
verdict = attribute_bundle(Bundle(path="m", job=job, job_log=(line + "\\n") * 1000), catalogue)
assert verdict.culprit_nodes == [], verdict
print("ok")
"""
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "ok"


def test_row_7_a_160kb_line_costs_attribution_milliseconds() -> None:
    hostile = "mlx5_core " * 16000 + "Segmentation fault\n"
    verdict = bounded(lambda: attribute_bundle(bundle(hostile * 20), CATALOGUE))
    assert verdict.culprit_nodes == []


def test_row_8_a_line_stamped_in_the_future_does_not_age_out_a_real_xid() -> None:
    for stamp in ("2099-01-01T00:00:00Z", "1999-01-01T00:00:00Z"):
        log = f"{stamp} 0: starting\n[{T:%Y-%m-%d %H:%M:%S}] iteration 1/ 10 |\n"
        found = collect(bundle(log, {"n2": XID_79_N2}), CATALOGUE)
        assert found.first_time is not None and found.first_time.year == 2026
        assert found.ignored_times == 1
        assert [f.signature for f in found.items] == ["xid_79"] and found.stale == []
        verdict = attribute_bundle(bundle(log, {"n2": XID_79_N2}), CATALOGUE)
        assert verdict.category is Category.GPU_HARDWARE and verdict.culprit_nodes == ["n2"]


def test_a_job_line_with_an_implausible_time_is_not_used_to_order_findings() -> None:
    log = (
        "1999-01-01T00:00:00Z 0: RuntimeError: CUDA error: an illegal memory access\n"
        f"{T + timedelta(minutes=1):%Y-%m-%dT%H:%M:%S}Z n1 python: ValueError: bad batch\n"
    )
    found = collect(bundle(log), CATALOGUE)
    times = {f.signature: f.time for f in found.items}
    assert times == {"cuda_error": None, "python_exception": T + timedelta(minutes=1)}


def test_a_flood_of_one_line_keeps_a_bounded_number_of_findings() -> None:
    log = "0: RuntimeError: CUDA error: an illegal memory access\n" * 50_000
    found = collect(bundle(log), CATALOGUE)
    kept = [f for f in found.items if f.path == "logs/job.log"]
    assert len(kept) == MAX_KEPT_PER_SIGNATURE
    assert sum(found.dropped.values()) == 50_000 - MAX_KEPT_PER_SIGNATURE


def test_a_big_bundle_log_is_read_from_disk_and_only_its_end_held(tmp_path: Path) -> None:
    noise = "0: gpu1:1:1 [0] NCCL INFO Channel 00/32 : 0[0] -> 1[1] via NET/IB/0\n"
    body = noise * (3 * INLINE_LOG_BYTES // len(noise))
    log = "srun: error: Node failure on n3\n" + body + "1: step=9 loss=0.1 rank=1\n"
    loaded = read_bundle(write_bundle(tmp_path / "b", job(), log))
    assert loaded.job_log_file is not None
    assert len(loaded.job_log.encode()) <= INLINE_LOG_BYTES and loaded.job_log.endswith("rank=1\n")
    found = collect(loaded, CATALOGUE)
    (first,) = [f for f in found.items if f.signature == "srun_node_failure"]
    assert (first.match.line_no, first.node) == (1, "n3")
    # The straggler rules get the head and the end of the log, not all of it.
    assert found.job_lines[0].startswith("srun: error") and found.job_lines[-1].endswith("rank=1")
    assert len(found.job_lines) < 100_000


def test_torchrun_blocks_and_nccl_addresses_are_found_across_a_big_log() -> None:
    block = (
        "[0]:\n  time      : 2026-11-30_10:05:00\n  host      : n3\n"
        "  rank      : 5 (local_rank: 1)\n  exitcode  : -6 (pid: 77)\n"
    )
    boot = "n2:11:11 [0] NCCL INFO Bootstrap : Using ib0:10.0.0.2<0>\n"
    noise = "0: gpu1:1:1 [0] NCCL INFO Channel 00/32 : 0[0] -> 1[1] via NET/IB/0\n" * 20_000
    found = collect(bundle(boot + noise + block + noise), CATALOGUE)
    assert found.rank_hosts == {5: "n3"} and found.torchrun_exits == {5: -6}


# --------------------------------------------------------------------------- random input

_LITERALS = sorted({w for s in CATALOGUE.signatures for w in required_literals(s.pattern) or []})
_TOKENS = [
    *_LITERALS,
    "srun: error: Node failure on ",
    "a[0-999][0-999][0-999]",
    "n[1-4]",
    "n2",
    "NVRM: Xid (PCI:0000:3b:00): ",
    "79",
    "0: ",
    "[rank3]: ",
    "2099-01-01T00:00:00Z ",
    "1999-01-01 00:00:00 ",
    "2026-11-30T10:02:00Z ",
    "step=",
    "rank=",
    "node=",
    "WorkNCCL(SeqNum=",
    "host      : ",
    "exitcode  : ",
    "rank      : 5 (local_rank: 0)",
    "Bootstrap : Using ib0:10.0.0.1<0>",
    "*** JOB 7 ON n1 CANCELLED AT 2026-11-30T10:03:00 ***",
    " ",
    ":",
    "[",
    "]",
    "(",
    ")",
    "\t",
    "9" * 30,
    "\r",
    "é",
    "\x00",
]
_TOKEN = st.one_of(st.sampled_from(_TOKENS), st.text(max_size=12))
LINES = st.lists(
    st.builds(
        lambda parts, rep: "".join(parts) * rep, st.lists(_TOKEN, max_size=12), st.integers(1, 400)
    ),
    max_size=40,
)
FUZZ = settings(
    max_examples=150,
    deadline=None,  # wall time on a shared machine is noise: the budget is CPU time
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    derandomize=True,
    database=None,
)


@FUZZ
@given(LINES)
def test_the_scanner_survives_random_lines(lines: list[str]) -> None:
    data = "\n".join(lines).encode("utf-8", "surrogatepass")
    found = bounded(lambda: CATALOGUE.scan_bytes(data, source="job_log"))
    assert all(1 <= m.line_no <= data.count(b"\n") + 1 for m in found)
    assert all(len(m.text) <= 500 for m in found)


@FUZZ
@given(
    LINES,
    st.sampled_from(["FAILED", "RUNNING", "NODE_FAIL", "CANCELLED", "TIMEOUT", ""]),
    st.dictionaries(st.sampled_from(NODES), LINES.map("\n".join), max_size=2),
)
def test_attribution_survives_random_bundles(
    lines: list[str], state: str, node_logs: dict[str, str]
) -> None:
    subject = bundle("\n".join(lines), node_logs, state=state)
    verdict = bounded(lambda: attribute_bundle(subject, CATALOGUE))
    assert set(verdict.culprit_nodes) <= set(NODES)


@FUZZ
@given(LINES)
def test_progress_tracking_survives_random_lines(lines: list[str]) -> None:
    tracker = ProgressTracker(max_ranks=8)

    def feed() -> None:
        for no, line in enumerate(lines):
            tracker.observe(line, float(no))

    bounded(feed)
    assert all(r is None or 0 <= r < 8 for r in tracker.ranks)


_HOSTLIST = st.one_of(
    st.text(alphabet="an-[],0123456789 .", max_size=60),
    st.builds(
        lambda prefix, groups: prefix + "".join(f"[{lo}-{lo + span}]" for lo, span in groups),
        st.sampled_from(["n", "gpu-a", "a", ""]),
        st.lists(st.tuples(st.integers(0, 10**12), st.integers(0, 10**6)), max_size=4),
    ),
)


@settings(max_examples=300, deadline=None, derandomize=True, database=None)
@given(_HOSTLIST, st.one_of(st.none(), st.integers(1, 100_000)))
def test_hostlist_expansion_is_bounded(expr: str, limit: int | None) -> None:
    try:
        hosts = bounded(lambda: expand(expr, limit=limit))
    except InvalidNameError:
        return
    assert len(hosts) <= min(limit or DEFAULT_MAX_HOSTS, DEFAULT_MAX_HOSTS)
    assert len(hosts) == count(expr)
