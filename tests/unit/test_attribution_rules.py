"""Attribution rules beyond root-versus-cascade: time windows, the driver rule, torchrun's
host field, telemetry, hangs and their stragglers, OOM confirmation, reputation."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from relaunch.detection.attribution import attribute_bundle, implicated
from relaunch.models.bundle import Bundle, BundleJob, TelemetrySample
from relaunch.models.recovery import Action, Category

NODES = ["gpu01", "gpu02", "gpu03", "gpu04"]
T = datetime(2026, 11, 30, 10, 0, tzinfo=UTC)


def make(
    log: str,
    *,
    state: str = "FAILED",
    node_logs: dict[str, str] | None = None,
    telemetry: list[TelemetrySample] | None = None,
    ranks: dict[str, str] | None = None,
    **job: object,
) -> Bundle:
    return Bundle(
        path="mem",
        job=BundleJob(
            cluster="c",
            job_id="7",
            state=state,
            nodes=NODES,
            ranks=ranks,
            observed_at=T + timedelta(minutes=30),
            **job,  # type: ignore[arg-type]
        ),
        job_log=log,
        node_logs=node_logs or {},
        telemetry=telemetry or [],
    )


def xid(xid: int, when: datetime, host: str) -> str:
    return f"{when.isoformat()} {host} kernel: NVRM: Xid (PCI:0000:3b:00): {xid}, pid=1, text"


START = f"[{T:%Y-%m-%d %H:%M:%S}] iteration        1/ 1000 | consumed samples: 8 |\n"
WATCHDOG = (
    "{r}: [rank{r}]:[E1130 10:20:00.1 ProcessGroupNCCL.cpp:697] [Rank {r}] Watchdog caught "
    "collective operation timeout: WorkNCCL(SeqNum={s}, OpType=ALLREDUCE, NumelIn=1, "
    "NumelOut=1, Timeout(ms)=600000) ran for 600000 milliseconds before timing out.\n"
)


def test_a_node_line_from_before_the_job_is_set_aside() -> None:
    old = xid(79, T - timedelta(days=7), "gpu02")
    v = attribute_bundle(make(START + "0: RuntimeError: bad shape\n", node_logs={"gpu02": old}))
    assert v.category is Category.APPLICATION and v.culprit_nodes == []


def test_the_same_driver_xid_on_most_nodes_is_the_driver() -> None:
    logs = {n: xid(119, T + timedelta(minutes=1), n) for n in NODES[:3]}
    v = attribute_bundle(make(START, node_logs=logs))
    assert v.category is Category.INFRASTRUCTURE and v.culprit_nodes == []
    one = attribute_bundle(make(START, node_logs={"gpu03": logs["gpu03"]}))
    assert one.category is Category.GPU_HARDWARE and one.culprit_nodes == ["gpu03"]


def test_two_independent_culprits() -> None:
    logs = {
        "gpu02": xid(79, T + timedelta(minutes=1), "gpu02"),
        "gpu04": xid(48, T + timedelta(minutes=2), "gpu04"),
    }
    v = attribute_bundle(make(START + WATCHDOG.format(r=0, s=5), node_logs=logs))
    assert v.category is Category.GPU_HARDWARE and v.culprit_nodes == ["gpu02", "gpu04"]
    assert v.action is Action.ISOLATE_AND_RESTART
    assert v.folded == {"nccl_watchdog_timeout": 1}


def test_torchrun_host_field_maps_a_rank_to_its_node() -> None:
    log = (
        "[rank5]: RuntimeError: CUDA error: uncorrectable ECC error encountered\n"
        "Root Cause (first observed failure):\n[0]:\n"
        "  time      : 2026-11-30_10:05:00\n"
        "  host      : gpu03.cluster.example.com\n"
        "  rank      : 5 (local_rank: 1)\n"
        "  exitcode  : 1 (pid: 4242)\n"
    )
    v = attribute_bundle(make(log))
    assert v.category is Category.GPU_HARDWARE and v.culprit_nodes == ["gpu03"]


def test_telemetry_double_bit_errors_rising() -> None:
    samples = [
        TelemetrySample(node="gpu04", gpu=2, time=T - timedelta(hours=1), ecc_dbe_volatile=1),
        TelemetrySample(node="gpu04", gpu=2, time=T + timedelta(minutes=3), ecc_dbe_volatile=3),
        TelemetrySample(node="gpu01", gpu=0, time=T + timedelta(minutes=3), xid=63),
    ]
    v = attribute_bundle(make(START + WATCHDOG.format(r=1, s=9), telemetry=samples))
    assert v.category is Category.GPU_HARDWARE and v.culprit_nodes == ["gpu04"]
    flat = [samples[0], samples[0].model_copy(update={"time": T + timedelta(minutes=3)})]
    assert attribute_bundle(make(START, telemetry=flat)).culprit_nodes == []


def test_a_hang_names_the_lagging_rank_through_the_map() -> None:
    ranks = {str(r): NODES[r] for r in range(4)}
    log = START + "".join(WATCHDOG.format(r=r, s=4520 if r == 2 else 4521) for r in range(4))
    v = attribute_bundle(make(log, ranks=ranks))
    assert v.category is Category.HANG and v.culprit_nodes == ["gpu03"]
    assert "SeqNum 4520" in v.summary
    no_map = attribute_bundle(make(log))
    assert no_map.category is Category.HANG and no_map.culprit_nodes == []
    assert no_map.action is Action.RESTART


def test_a_time_limit_long_after_the_last_progress_is_a_hang() -> None:
    stalled = make(START, state="TIMEOUT", last_progress_at=T)
    assert attribute_bundle(stalled).category is Category.HANG
    busy = make(START, state="TIMEOUT", last_progress_at=T + timedelta(minutes=29))
    assert attribute_bundle(busy).category is Category.TIME_LIMIT


def test_a_bare_kill_is_unknown_until_an_oom_record_confirms_it() -> None:
    log = START + "srun: error: gpu02: task 1: Killed\n"
    assert attribute_bundle(make(log)).category is Category.UNKNOWN
    oom = (
        f"{(T + timedelta(minutes=1)).isoformat()} gpu02 kernel: Memory cgroup out of memory: "
        "Killed process 41237 (python) total-vm:98765432kB, anon-rss:65432100kB, file-rss:0kB, "
        "shmem-rss:2048kB, UID:1000 pgtables:131072kB oom_score_adj:0"
    )
    v = attribute_bundle(make(log, node_logs={"gpu02": oom}))
    assert v.category is Category.APPLICATION and v.culprit_nodes == []


def test_reputation_names_a_repeat_offender_only_when_the_log_names_nobody() -> None:
    bare = make(START + "srun: error: gpu02: task 1: Exited with exit code 1\n")
    plain = attribute_bundle(bare)
    assert plain.category is Category.UNKNOWN and plain.culprit_nodes == []
    assert implicated(plain, bare) == []  # no trusted source implicates any node
    v = attribute_bundle(bare, reputation={"gpu03": 3, "gpu01": 2})
    assert v.culprit_nodes == ["gpu03"] and v.repeat_offenders == ["gpu03"]
    assert v.corroboration == {"gpu03": ["reputation"]}
    assert v.action is Action.ISOLATE_AND_RESTART and v.confidence <= 0.5
    assert "repeat offender" in v.summary
    assert implicated(v, bare) == []  # a name from reputation alone is not charged again
    app = make(START + "0: ValueError: bad config\n")
    assert attribute_bundle(app, reputation={"gpu03": 9}).culprit_nodes == []
    assert implicated(attribute_bundle(app), app) == []


def test_copies_across_ranks_are_one_evidence_line_with_a_count() -> None:
    log = START + "".join(f"{r}: torch.OutOfMemoryError: CUDA out of memory.\n" for r in range(3))
    v = attribute_bundle(make(log, ranks={str(r): NODES[r] for r in range(4)}))
    assert v.category is Category.APPLICATION and v.culprit_nodes == []
    assert sorted(e.count for e in v.evidence) == [1, 1, 1]  # one per node it came from
    shared = attribute_bundle(make(log, ranks={str(r): "gpu01" for r in range(4)}))
    assert [e.count for e in shared.evidence] == [3]


def test_srun_task_labels_and_pytorch_ranks_are_different_numberings() -> None:
    torchrun = (
        "Root Cause (first observed failure):\n[0]:\n"
        "  time      : 2026-11-30_10:05:00\n"
        "  host      : gpu01\n"
        "  rank      : 2 (local_rank: 2)\n"
        "  exitcode  : 1 (pid: 4242)\n"
    )
    ecc = "RuntimeError: CUDA error: uncorrectable ECC error encountered\n"
    # torchrun under srun, one task per node: task 2 is the third node, whatever rank 2 is.
    by_task = attribute_bundle(make(START + "2: " + ecc + torchrun))
    assert by_task.culprit_nodes == ["gpu03"]
    # PyTorch's own rank label goes through torchrun's rank → host map.
    by_rank = attribute_bundle(make(START + "[rank2]: " + ecc + torchrun))
    assert by_rank.culprit_nodes == ["gpu01"]


def test_a_rank_whose_own_socket_was_aborted_is_the_network_culprit() -> None:
    log = (
        START
        + "1: [rank1]: RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Read "
        "error [127.0.0.1]:41512: Software caused connection abort\n"
        "0: [rank0]: RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:553] "
        "Connection closed by peer [127.0.0.1]:8616. This is typically caused by a remote "
        "worker crashing.\n"
        "srun: error: gpu02: task 1: Exited with exit code 1\n"
    )
    v = attribute_bundle(make(log))
    assert v.category is Category.NETWORK and v.culprit_nodes == ["gpu02"]
    # The job's own output names it: excluded from the restart, not drained.
    assert v.action is Action.EXCLUDE_AND_RESTART and v.corroboration == {"gpu02": []}
