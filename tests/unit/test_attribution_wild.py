"""Issue 35: what failed under the job is infrastructure, restarted (never held, never drained),
with the file system or resource named; a hang whose nodes' kernels report tasks blocked in a
network file system is storage; and the NIC's own health lines convict its node while a user's
copy of them does not."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from relaunch.detection.attribution import attribute_bundle
from relaunch.detection.planning import PlanHistory, make_plan
from relaunch.models.bundle import Bundle, BundleJob
from relaunch.models.recovery import (
    Action,
    ActionPlan,
    Category,
    EvidenceSummary,
    JobSnapshot,
    Policy,
    Verdict,
)

NODES = ["n1", "n2"]
RANKS = {"0": "n1", "1": "n1", "2": "n2", "3": "n2"}
T = datetime(2026, 12, 4, 22, 0, tzinfo=UTC)


def bundle(log: str, node_logs: dict[str, str] | None = None, state: str = "FAILED") -> Bundle:
    return Bundle(
        path="mem",
        job=BundleJob(
            cluster="c",
            job_id="7",
            state=state,
            nodes=NODES,
            ranks=RANKS,
            observed_at=T,
            submit_time=T - timedelta(hours=2),
            node_states=dict.fromkeys(NODES, "ALLOCATED"),
        ),
        job_log=log,
        node_logs=node_logs or {},
        health=[],
    )


def plan(b: Bundle, v: Verdict) -> ActionPlan:
    return make_plan(
        request_id="r",
        verdict=v,
        evidence=EvidenceSummary(
            incident_id="i",
            bundle_path="/b",
            job=JobSnapshot(job_id="7", state=b.job.state, nodes=NODES, restart_count=0),
            node_states=b.job.node_states,
        ),
        policy=Policy(),
        history=PlanHistory(partition_size=40),
    )


def restarted_not_blamed(b: Bundle, *named: str) -> Verdict:
    """The verdict is infrastructure, restarts, blames and drains nobody, names ``named``."""
    v = attribute_bundle(b)
    assert (v.category, v.culprit_nodes, v.action) == (
        Category.INFRASTRUCTURE,
        [],
        Action.RESTART,
    ), v
    for word in named:
        assert word in v.summary, v.summary
    p = plan(b, v)
    assert (p.action, p.drain_nodes, p.exclude_nodes) == (Action.RESTART, [], []), p
    return v


def watchdog(rank: int) -> str:
    return (
        f"{rank}: [rank{rank}]:[E1204 21:55:00.1 ProcessGroupNCCL.cpp:697] [Rank {rank}] Watchdog "
        "caught collective operation timeout: WorkNCCL(SeqNum=9, OpType=ALLREDUCE, NumelIn=1, "
        "NumelOut=1, Timeout(ms)=600000) ran for 600000 milliseconds before timing out.\n"
    )


HANG = "".join(watchdog(r) for r in range(4))
# whamcloud/integrated-manager-for-lustre#329's report (Lustre client), with the node's syslog
# stamps (the kernel's own time after them).
LUSTRE = (
    "2026-12-04T21:50:00+00:00 n2 kernel: [ 3600.832490] INFO: task python3:4037 blocked for "
    "more than 120 seconds.\n"
    "2026-12-04T21:50:00+00:00 n2 kernel: [ 3600.843176] Call Trace:\n"
    "2026-12-04T21:50:00+00:00 n2 kernel: [ 3600.844367]  [<ffffffff816a94c9>] schedule+0x29/0x70\n"
    "2026-12-04T21:50:00+00:00 n2 kernel: [ 3600.851751]  [<ffffffffc05523b4>] "
    "llog_process_or_fork+0x244/0x450 [obdclass]\n"
    "2026-12-04T21:50:00+00:00 n2 kernel: [ 3600.856750]  [<ffffffffc0fff5a8>] "
    "mgc_process_cfg_log+0x788/0xc40 [mgc]\n"
)
LOCAL_DISK = (
    "2026-12-04T21:50:00+00:00 n2 kernel: [27792.382537] INFO: task jbd2/vblkdev3-8:722 blocked "
    "for more than 120 seconds.\n"
    "2026-12-04T21:50:00+00:00 n2 kernel: [27792.382548]  [<ffffffffa00667f1>] "
    "jbd2_journal_commit_transaction+0x1181/0x1500 [jbd2]\n"
)


def test_a_hang_blocked_in_a_network_file_system_is_storage_restarted() -> None:
    assert attribute_bundle(bundle(HANG)).category is Category.HANG
    v = restarted_not_blamed(bundle(HANG, {"n2": LUSTRE}), "Lustre", "n2")
    assert any(e.signature == "hung_task_filesystem" and e.trusted for e in v.evidence)


def test_a_hang_that_ran_into_its_time_limit_blocked_in_nfs_is_storage() -> None:
    nfs = (
        LUSTRE.replace("[obdclass]", "[sunrpc]")
        .replace("[mgc]", "[nfs]")
        .replace("n2 kernel", "n1 kernel")
    )
    b = bundle(HANG, {"n1": nfs}, state="TIMEOUT")
    b.job.last_progress_at = T - timedelta(hours=1)
    restarted_not_blamed(b, "NFS", "n1")


@pytest.mark.parametrize(
    "node_logs",
    [
        {"n2": LOCAL_DISK},  # a local disk is not a network file system
        {},  # the report only in the job's output: a user can print anything
    ],
)
def test_other_blocked_tasks_leave_the_hang_a_hang(node_logs: dict[str, str]) -> None:
    log = HANG if node_logs else HANG + LUSTRE.replace("n2 kernel: ", "")
    assert attribute_bundle(bundle(log, node_logs)).category is Category.HANG


@pytest.mark.parametrize(
    ("line", "port"),
    [
        (
            "torch.distributed.DistNetworkError: The server socket has failed to listen on any "
            "local network address. port: 29500, useIpv6: false, code: -98, name: EADDRINUSE, "
            "message: address already in use",
            "29500",
        ),
        (
            "RuntimeError: The server socket has failed to listen on any local network address. "
            "The server socket has failed to bind to [::]:29500 (errno: 98 - Address already in "
            "use). The server socket has failed to bind to 0.0.0.0:29500 (errno: 98 - Address "
            "already in use).",
            "29500",
        ),
        ("RuntimeError: Address already in use", ""),
    ],
)
def test_rendezvous_port_in_use_restarts(line: str, port: str) -> None:
    log = (
        "0: Traceback (most recent call last):\n"
        '0:   File "/usr/lib/python3/dist-packages/torch/distributed/rendezvous.py", line 189\n'
        f"0: {line}\n"
        "srun: error: n1: task 0: Exited with exit code 1\n"
    )
    restarted_not_blamed(bundle(log), "rendezvous port", port)


def test_an_io_error_on_the_shared_file_system_at_checkpoint_restarts() -> None:
    # torch.distributed.checkpoint wraps each rank's failure in a CheckpointException, whose
    # line comes before the OSError it carries.
    log = (
        "0: saving checkpoint at iteration 1000 to /lustre/fs1/ckpt\n"
        "0: Traceback (most recent call last):\n"
        "0: torch.distributed.checkpoint.api.CheckpointException: CheckpointException "
        "ranks:dict_keys([0])\n"
        "0: Traceback (most recent call last): (RANK 0)\n"
        "0: OSError: [Errno 5] Input/output error: '/lustre/fs1/ckpt/iter_0001000/__0_0.distcp'\n"
    )
    restarted_not_blamed(bundle(log), "storage", "/lustre/fs1")


def test_a_failed_checkpoint_write_names_storage() -> None:
    # rwth-i6/returnn#1829: torch.save's writer on a shared file system.
    log = (
        "0: RuntimeError: [enforce fail at inline_container.cc:857] . PytorchStreamWriter failed "
        "writing file data/322: file write failed\n"
    )
    restarted_not_blamed(bundle(log), "storage: a checkpoint write failed")


@pytest.mark.parametrize(
    ("line", "named"),
    [
        (
            "n1:2143:2561 [1] include/shm.h:28 NCCL WARN Call to posix_fallocate failed : No "
            "space left on device",
            "/dev/shm",
        ),
        ("0: OSError: [Errno 28] No space left on device: '/tmp/torchelastic_x/attempt_0'", "/tmp"),
        ("0: OSError: [Errno 24] Too many open files", "file descriptors"),
    ],
)
def test_node_local_resource_exhaustion_restarts(line: str, named: str) -> None:
    restarted_not_blamed(bundle(line + "\n" + HANG), "node-local resource", named)


def test_an_application_error_stays_held_whatever_is_near_it() -> None:
    v = attribute_bundle(bundle("0: [rank0]: KeyError: 'labels'\n"))
    assert (v.category, v.action) == (Category.APPLICATION, Action.HOLD)
    # A specific application root (a CUDA OOM) before a storage line is still the cause.
    oom = (
        "0: [rank0]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. "
        "GPU 0 has a total capacity of 79.11 GiB of which 1.05 GiB is free.\n"
        "0: OSError: [Errno 5] Input/output error\n"
    )
    assert attribute_bundle(bundle(oom)).category is Category.APPLICATION


# ------------------------------------------------------------------ NIC health corroborates

# The job's NCCL names n2: its bootstrap line maps 10.0.0.2 to n2, and n1 got an IB completion
# error from that peer (the suspect is the peer).
IB_ERROR = (
    "2: n2:2002:2002 [0] NCCL INFO Bootstrap : Using ib0:10.0.0.2<0>\n"
    "0: n1:1001:1090 [0] transport/net_ib.cc:1696 NCCL WARN NET/IB : Got completion from peer "
    "10.0.0.2<47534> with error 12, opcode 0, len 0, vendor err 129 (Recv)\n"
)
# The NIC's health poller on n2 (drivers/net/ethernet/mellanox/mlx5/core/health.c), in the
# 4.x / MLNX_OFED prefix (the device name again before the function) and the 5.x+ one.
NIC_HEALTH = [
    "mlx5_core 0000:3b:00.0: 0000:3b:00.0:poll_health:742:(pid 0): device's health compromised "
    "- reached miss count",
    "mlx5_core 0000:3b:00.0: mlx5_health_try_recover:327:(pid 1234): handling bad device here",
    "mlx5_core 0000:3b:00.0: mlx5_fw_fatal_reporter_err_work:699:(pid 12): Driver is in error "
    "state. Unloading",
]


@pytest.mark.parametrize("health", NIC_HEALTH)
def test_the_nics_own_kernel_log_convicts_the_node_the_job_names(health: str) -> None:
    b = bundle(IB_ERROR + HANG, {"n2": f"2026-12-04T21:54:00+00:00 n2 kernel: {health}\n"})
    v = attribute_bundle(b)
    assert (v.category, v.culprit_nodes, v.action) == (
        Category.NETWORK,
        ["n2"],
        Action.ISOLATE_AND_RESTART,
    ), v
    assert v.corroboration == {"n2": ["kernel_log"]}
    assert plan(b, v).drain_nodes == ["n2"]


@pytest.mark.parametrize("health", NIC_HEALTH)
@pytest.mark.parametrize(
    "where",
    ["job", "tag"],  # printed by the job; or in n2's log under another syslog tag (logger -t)
)
def test_a_users_copy_of_the_nic_lines_convicts_nobody(health: str, where: str) -> None:
    copy = f"2026-12-04T21:54:00+00:00 n2 kernel: {health}\n"
    if where == "job":
        b = bundle(copy + IB_ERROR + HANG)
    else:
        b = bundle(IB_ERROR + HANG, {"n2": copy.replace(" kernel: ", " mlx5_core: ")})
    v = attribute_bundle(b)
    assert (v.category, v.culprit_nodes, v.action) == (
        Category.NETWORK,
        ["n2"],
        Action.EXCLUDE_AND_RESTART,
    ), v
    assert v.corroboration == {"n2": []}
    p = plan(b, v)
    assert (p.drain_nodes, p.exclude_nodes) == ([], ["n2"])


# ------------------------------------------------------------------ GPU memory held by others


def oom(others: str) -> str:
    """PyTorch's OOM message (c10/cuda/CUDACachingAllocator.cpp: NVML's other processes as
    `Process <pid> has <size> memory in use. `, then this process's own)."""
    return (
        "2: [rank2]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.50 GiB. GPU 0 "
        f"has a total capacity of 79.10 GiB of which 402.00 MiB is free. {others}Including "
        "non-PyTorch memory, this process has 1.84 GiB memory in use. Of the allocated memory "
        "1.21 GiB is allocated by PyTorch, and 96.00 MiB is reserved by PyTorch but unallocated.\n"
    )


def test_an_oom_on_a_gpu_other_processes_hold_restarts() -> None:
    v = restarted_not_blamed(
        bundle(oom("Process 176521 has 76.84 GiB memory in use. ")),
        "GPU memory held by other processes",
        "176521",
    )
    assert v.evidence[0].signature == "cuda_oom_gpu_held"


@pytest.mark.parametrize(
    "others",
    ["", "Process 176521 has 2.00 GiB memory in use. "],  # its own OOM; a small neighbour
)
def test_the_jobs_own_oom_is_still_held(others: str) -> None:
    v = attribute_bundle(bundle(oom(others)))
    assert (v.category, v.action, v.culprit_nodes) == (Category.APPLICATION, Action.HOLD, [])


def test_a_gpu_fallen_off_the_bus_without_an_xid_drains_its_node() -> None:
    # NVIDIA/NVSentinel#155's dmesg record on n2 (no Xid), and the job's ranks timing out.
    fallen = (
        "[ 1843.308145] NVRM: The NVIDIA GPU 0000:b3:00.0\n"
        "               NVRM: (PCI ID: 10de:26b5) installed in this system has\n"
        "               NVRM: fallen off the bus and is not responding to commands.\n"
    )
    b = bundle(HANG, {"n2": fallen})
    v = attribute_bundle(b)
    assert (v.category, v.culprit_nodes, v.action) == (
        Category.GPU_HARDWARE,
        ["n2"],
        Action.ISOLATE_AND_RESTART,
    ), v
    assert v.corroboration == {"n2": ["kernel_log"]}
    assert plan(b, v).drain_nodes == ["n2"]
