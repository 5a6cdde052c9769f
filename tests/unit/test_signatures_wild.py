"""Issue 35: signatures for failure lines seen on real clusters, each tested on the line as it was
posted (the thread or source file named beside it), in every version's form; kernel-side ones only
where the kernel or driver writes them (docs/trust.md)."""

from __future__ import annotations

import pytest

from relaunch.detection.hung_tasks import hung_tasks
from relaunch.detection.kernel_lines import kernel_frame
from relaunch.detection.signatures import Catalogue, Role
from relaunch.models.recovery import Category

CATALOGUE = Catalogue.load()


def job(line: str) -> tuple[str, Category, Role, str | None] | None:
    """What the catalogue makes of a line of job output."""
    m = CATALOGUE.match_line(line, line_no=1, source="job_log")
    return None if m is None else (m.signature, m.category, m.role, m.host)


def kernel(line: str) -> str | None:
    """The entry a line of a node's kernel log matches as trusted kernel evidence."""
    m = CATALOGUE.match_line(line, line_no=1, source="node_log", source_node="n1", kernel=True)
    return None if m is None else m.signature


# ------------------------------------------------------------------ NIC health (mlx5)

# drivers/net/ethernet/mellanox/mlx5/core/health.c; the prefix is mlx5_core_err/warn's
# "%s:%d:(pid %d): " (5.x+) or "%s:%s:%d:(pid %d): " with the device name first (4.x, MLNX_OFED:
# real 'mlx5_core 0000:03:00.0: 0000:03:00.0:handle_hca_cap:438:(pid 6016): ...',
# PeterSuh-Q3/tinycore-redpill#9).
MLX5_KERNEL = [
    "[ 8123.456789] mlx5_core 0000:3b:00.0: mlx5_health_try_recover:327:(pid 1234): handling bad "
    "device here",
    "[ 8123.456789] mlx5_core 0000:3b:00.0: 0000:3b:00.0:health_care:293:(pid 1234): handling "
    "bad device here",
    "2026-12-04T21:58:00+00:00 n1 kernel: mlx5_core 0000:3b:00.0: "
    "mlx5_fw_fatal_reporter_err_work:699:(pid 12): Driver is in error state. Unloading",
    "Dec  4 21:58:00 n1 kernel: mlx5_core 0000:3b:00.0: poll_health:798:(pid 0): Fatal error 1 "
    "detected",
    "<3>[ 8123.456789] mlx5_core 0000:3b:00.0: 0000:3b:00.0:poll_health:742:(pid 0): device's "
    "health compromised - reached miss count",
    "mlx5_core 0000:3b:00.0: mlx5_health_try_recover:333:(pid 1234): health recovery flow "
    "aborted, PCI reads still not working",
    "mlx5_core 0000:03:00.0: synd 0x8: unrecoverable hardware error",
]


@pytest.mark.parametrize("line", MLX5_KERNEL)
def test_nic_health_lines_are_kernel_evidence_in_every_prefix_form(line: str) -> None:
    assert kernel(line) == "mlx5_fatal"


@pytest.mark.parametrize(
    "line",
    [
        # A user's process named after the driver: its segfault report quotes the comm first.
        "[ 8123.456789] mlx5_core 0000:[1234]: segfault at 0 ip 0 sp 0 error 4 in a.out",
        # Another syslog tag (logger -t), or the driver's words after some other text.
        "2026-12-04T21:58:00+00:00 n1 logger: mlx5_core 0000:3b:00.0: poll_health:798:(pid 0): "
        "Fatal error 1 detected",
        "2026-12-04T21:58:00+00:00 n1 kernel: user says mlx5_core 0000:3b:00.0: handling bad "
        "device here",
        # The recovery that worked is no fault; an unrelated mlx5 warning neither.
        "mlx5_core 0000:3b:00.0: mlx5_health_try_recover:340:(pid 1234): health recovery succeeded",
    ],
)
def test_nic_health_words_elsewhere_are_not_kernel_evidence(line: str) -> None:
    assert kernel(line) != "mlx5_fatal"


# ------------------------------------------------------------------ NVRM without an Xid

NVRM = [
    # NVIDIA/open-gpu-kernel-modules#688 (journal, DGX Station A100)
    (
        "Feb 17 08:00:34 abggdna-DGX-Station-A100 kernel: NVRM: nvAssertOkFailedNoLog: Assertion "
        "failed: GPU lost from the bus [NV_ERR_GPU_IS_LOST] (0x0000000F) returned from rmStatus @ "
        "kernel_ce_gv100.c:106",
        "nvrm_gpu_lost",
    ),
    # scitix/sichek#51 (dmesg -T)
    (
        "[Sun Jan 11 09:52:01 2026] NVRM: nvAssertOkFailedNoLog: Assertion failed: Reset "
        "required [NV_ERR_RESET_REQUIRED] (0x00000062) returned from status @ "
        "kernel_channel.c:2874",
        "nvrm_reset_required",
    ),
    # kubernetes-sigs/dra-driver-nvidia-gpu#982 (GB200, dmesg)
    (
        "[373871.354096] NVRM: nvAssertOkFailedNoLog: Assertion failed: Reset required "
        "[NV_ERR_RESET_REQUIRED] (0x00000062) returned from status @ kernel_channel.c:2827",
        "nvrm_reset_required",
    ),
    # newer drivers name the GPU before the macro (NVIDIA/open-gpu-kernel-modules#1045 form)
    (
        "NVRM: GPU0 nvAssertOkFailedNoLog: Assertion failed: GPU lost from the bus "
        "[NV_ERR_GPU_IS_LOST] (0x0000000F) returned from rmStatus @ kernel_ce_gv100.c:106",
        "nvrm_gpu_lost",
    ),
]


@pytest.mark.parametrize(("line", "expected"), NVRM)
def test_nvrm_errors_without_an_xid_are_gpu_hardware_on_the_node(line: str, expected: str) -> None:
    assert kernel(line) == expected
    m = CATALOGUE.match_line(line, line_no=1, source="node_log", source_node="n1", kernel=True)
    assert m is not None and m.category is Category.GPU_HARDWARE and m.role is Role.ROOT
    assert m.host == "n1"


def test_an_nvrm_assertion_about_something_else_is_no_hardware_root() -> None:
    # NVIDIA/open-gpu-kernel-modules#1045: the driver's own bookkeeping during a reset.
    line = (
        "Jun 12 16:31:50 fedora-box kernel: NVRM: GPU0 nvAssertFailedNoLog: Assertion failed: "
        "(status == NV_OK) || (status == NV_ERR_GPU_IN_FULLCHIP_RESET) @ rs_client.c:844"
    )
    assert kernel(line) is None


# ------------------------------------------------------------------ NCCL IB async events


def test_open_mpi_output_tags_are_a_prefix() -> None:
    # NVIDIA/nccl#230: mpirun --timestamp-output --tag-output before NCCL's own prefix.
    line = (
        "2019-06-02T16:13:44.884Z: [1,12]<stdout>:container-e275-1553839402050-12124-01-000057:"
        "815:864 [0] transport/net_ib.cu:80 NCCL WARN NET/IB : Got async event : local "
        "catastrophic error"
    )
    found = job(line)
    assert found is not None and found[0] == "nccl_ib_async_fatal_old"
    assert found[3] == "container-e275-1553839402050-12124-01-000057"


@pytest.mark.parametrize(
    ("line", "expected", "host"),
    [
        # NVIDIA/nccl#230 (2019, NCCL 2.4: no <dev>:<port>)
        (
            "container-e275-1553839402050-12124-01-000057:815:864 [0] transport/net_ib.cu:80 NCCL "
            "WARN NET/IB : Got async event : local catastrophic error",
            "nccl_ib_async_fatal_old",
            "container-e275-1553839402050-12124-01-000057",
        ),
        # NVIDIA/nccl#1710 (2.19-2.22: <dev>:<port>, 'Got async event :')
        (
            "node201:127799:127863 [0] transport/net_ib.cc:101 NCCL WARN NET/IB : mlx5_0:1 Got "
            "async event : local access violation work queue error",
            "nccl_ib_async_fatal_old",
            "node201",
        ),
        # Lightning-AI/lit-llama#380 and NVIDIA/nccl#905: a port error is a flap, context
        (
            "...-48:34050:34121 [0] transport/net_ib.cc:93 NCCL WARN NET/IB : Got async event : "
            "port error",
            "nccl_ib_async_event",
            "...-48",
        ),
        # NVIDIA/nccl#1905 (2.21.5 with the fatal form): unchanged
        (
            "[2025-11-09 07:39:30] h100-28:238:1219 [0] transport/net_ib.cc:180 NCCL WARN NET/IB "
            ": mlx5_ib0:1 async fatal event on QP (0x7f69f01519a8): local access violation work "
            "queue error",
            "nccl_ib_fatal",
            "h100-28",
        ),
    ],
)
def test_nccl_ib_async_events_in_every_version(line: str, expected: str, host: str) -> None:
    found = job(line)
    assert found is not None and (found[0], found[3]) == (expected, host)
    assert found[1] is Category.NETWORK
    assert found[2] is (Role.CONTEXT if expected == "nccl_ib_async_event" else Role.ROOT)


# ------------------------------------------------------------------ NCCL shared memory


@pytest.mark.parametrize(
    "line",
    [
        # NVIDIA/nccl#290 (2.4-2.8, include/shm.h)
        "gpu2-ru7:2143:2561 [1] include/shm.h:28 NCCL WARN Call to posix_fallocate failed : No "
        "space left on device",
        # NVIDIA/nccl#342 (2.7.3: no space before the colon)
        "include/shm.h:28 NCCL WARN Call to posix_fallocate failed: No space left on device",
        # NVIDIA/nccl#525 (Kubeflow)
        "[3] include/shm.h:48 NCCL WARN Error while creating shared memory segment "
        "nccl-shm-recv-1462445a6f01cbfc-1-2-3 (size 9637888)",
        # pytorch/ci-infra#490 (2.2x, misc/shmutils.cc with the errno)
        "[2026-04-22 21:34:20] mt-l-x86iavx512-45-172-t4-4-csmpw-runner-g4sfw-workflow:202016:"
        "202235 [0] misc/shmutils.cc:88 NCCL WARN Error: failed to extend /dev/shm/nccl-WU88OE "
        "to 9637892 bytes, error: No space left on device (28)",
        # NVIDIA/nccl-tests#166 (shmutils.cc without the errno)
        "ubuntu:9621:9685 [0] misc/shmutils.cc:112 NCCL WARN Error while creating shared memory "
        "segment /dev/shm/nccl-zTYolS (size 5967872)",
    ],
)
def test_nccl_shared_memory_failures_are_node_local_infrastructure(line: str) -> None:
    assert job(line) == ("nccl_shm_exhausted", Category.INFRASTRUCTURE, Role.ROOT, None)


def test_attaching_to_a_missing_segment_is_not_a_full_dev_shm() -> None:
    # vllm-project/vllm#18831: another failure (the peer's segment is gone), not /dev/shm space.
    line = (
        "NCCL WARN Error while attaching to shared memory segment /dev/shm/nccl- (size "
        "192814336), error: No such file or directory (2)"
    )
    found = job(line)
    assert found is None or found[0] != "nccl_shm_exhausted"


# ------------------------------------------------------------------ nccl-tests


@pytest.mark.parametrize(
    ("line", "host"),
    [
        ("NCCL failure common.cu:874 'unhandled system error'", None),  # nccl-tests#14 (2018)
        ("fastmoe: Test NCCL failure common.cu:777 'unhandled system error'", "fastmoe"),  # #473
        (
            "ubuntu: Test NCCL failure common.cu:958 'unhandled system error (run with "
            "NCCL_DEBUG=INFO for details) / '",
            "ubuntu",
        ),  # nccl-tests#166 (NCCL >= 2.13: ' / <last error>')
        (
            "HCA-14: Test NCCL failure common.cu:1204 'unhandled cuda error (run with "
            "NCCL_DEBUG=INFO for details) / '",
            "HCA-14",
        ),  # nccl-tests#322
    ],
)
def test_nccl_tests_failure_lines(line: str, host: str | None) -> None:
    assert job(line) == ("nccl_tests_failure", Category.UNKNOWN, Role.ROOT, host)


def test_nccl_tests_teardown_and_busy_device() -> None:
    assert job(" .. ubuntu pid 9621: Test failure common.cu:842") == (
        "nccl_tests_abort",
        Category.UNKNOWN,
        Role.TEARDOWN,
        None,
    )
    # scitix/sichek#51: the busy device through nccl-tests' CUDACHECK
    busy = job(
        "Test CUDA failure common.cu:1007 'CUDA-capable device(s) is/are busy or unavailable'"
    )
    assert busy is not None and busy[:2] == ("cuda_device_busy", Category.INFRASTRUCTURE)


# ------------------------------------------------------------------ rendezvous port in use


@pytest.mark.parametrize(
    "line",
    [
        # PyTorch >= 2.4 (libuv store): vllm-project/vllm#39015, NVIDIA/Megatron-LM#1371
        "torch.distributed.DistNetworkError: The server socket has failed to listen on any local "
        "network address. port: 29500, useIpv6: false, code: -98, name: EADDRINUSE, message: "
        "address already in use",
        "RuntimeError: The server socket has failed to listen on any local network address. port: "
        "12341, useIpv6: 0, code: -98, name: EADDRINUSE, message: address already in use",
        # PyTorch 1.12-2.3: deepspeedai/DeepSpeed#3916, showlab/Tune-A-Video#90
        "RuntimeError: The server socket has failed to listen on any local network address. The "
        "server socket has failed to bind to [::]:29500 (errno: 98 - Address already in use). The "
        "server socket has failed to bind to 0.0.0.0:29500 (errno: 98 - Address already in use).",
        # the c10d warning line before it: pytorch/pytorch#85604
        "[W socket.cpp:401] [c10d] The server socket has failed to bind to 0.0.0.0:47531 (errno: "
        "98 - Address already in use).",
        # PyTorch 1.x TCPStore: NVIDIA/Megatron-LM#343, facebookresearch/SlowFast#337
        "RuntimeError: Address already in use",
        # Slurm's own step socket: PavlidisLab/rnaseq-pipeline#91
        "srun: error: unable to initialize step context socket: Address already in use",
    ],
)
def test_rendezvous_port_in_use_is_infrastructure(line: str) -> None:
    found = job(line)
    assert found is not None and found[:3] == (
        "store_address_in_use",
        Category.INFRASTRUCTURE,
        Role.ROOT,
    )


def test_a_users_own_server_in_use_is_not_the_rendezvous() -> None:
    # SJTU-IPADS/OS-Course-Lab#99: the user's own server; an application error like any other.
    found = job("OSError: [Errno 98] Address already in use")
    assert found is not None and found[0] == "python_exception"


# ------------------------------------------------------------------ storage and local resources


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        (
            "OSError: [Errno 5] Input/output error: '/lustre/ckpt/iter_0001000/model.pt'",
            "filesystem_error",
        ),
        (
            "RuntimeError: [enforce fail at inline_container.cc:337] . unexpected pos "
            "2554297920 vs 2554297808",
            "filesystem_error",
        ),
        (
            "RuntimeError: [enforce fail at inline_container.cc:424] . PytorchStreamWriter failed "
            "writing file data/0: file write failed",
            "filesystem_error",
        ),
        # pytorch/pytorch#10577 (PyTorch 1.0's serializer, a full disk)
        ("RuntimeError: write(): fd 29 failed with Input/output error", "filesystem_error"),
        ("OSError: [Errno 28] No space left on device: '/tmp/x'", "node_resource_exhausted"),
        ("OSError: [Errno 24] Too many open files", "node_resource_exhausted"),
        (
            "ERROR: Unexpected bus error encountered in worker. This might be caused by "
            "insufficient shared memory (shm).",
            "node_resource_exhausted",
        ),
    ],
)
def test_storage_and_node_local_resources_are_infrastructure(line: str, expected: str) -> None:
    found = job(line)
    assert found is not None and found[:3] == (expected, Category.INFRASTRUCTURE, Role.ROOT)


def test_a_quota_is_the_users_and_a_killed_worker_is_not_shm() -> None:
    quota = job("OSError: [Errno 122] Disk quota exceeded")
    assert quota is not None and quota[0] == "python_exception"
    killed = job("RuntimeError: DataLoader worker (pid 8) is killed by signal: Killed.")
    assert killed is not None and killed[0] != "node_resource_exhausted"


# ------------------------------------------------------------------ lost file systems


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        (
            "[ 6066.656127] nfs: server batalix not responding, still trying",
            "nfs_server_not_responding",
        ),
        (
            "2019-07-05T02:16:36.434763-04:00 f2-mds2 kernel: Lustre: f2-OST0035-osc-MDT0001: "
            "Connection to f2-OST0035 (at 10.10.33.50@o2ib2) was lost; in progress operations "
            "using this service will wait for recovery to complete",
            "lustre_connection_lost",
        ),
    ],
)
def test_lost_network_file_systems_are_kernel_context(line: str, expected: str) -> None:
    assert kernel(line) == expected
    assert kernel(line.replace(" kernel: ", " logger: ")) != expected or " kernel: " not in line


# ------------------------------------------------------------------ hung tasks

# whamcloud/integrated-manager-for-lustre#329 (RHEL 7, Lustre client), verbatim.
LUSTRE_HUNG = """\
[ 3600.832490] INFO: task ll_cfg_requeue:4037 blocked for more than 120 seconds.
[ 3600.834247] "echo 0 > /proc/sys/kernel/hung_task_timeout_secs" disables this message.
[ 3600.835946] ll_cfg_requeue  D 0000000000000001     0  4037      2 0x00000080
[ 3600.837626]  ffff880057f23b60 0000000000000046 ffff8800786e0000 ffff880057f23fd8
[ 3600.843176] Call Trace:
[ 3600.844367]  [<ffffffff816a94c9>] schedule+0x29/0x70
[ 3600.845770]  [<ffffffff816a6fd9>] schedule_timeout+0x239/0x2c0
[ 3600.847254]  [<ffffffff810c9ef9>] ? select_task_rq_fair+0x549/0x700
[ 3600.848761]  [<ffffffff816a987d>] wait_for_completion+0xfd/0x140
[ 3600.851751]  [<ffffffffc05523b4>] llog_process_or_fork+0x244/0x450 [obdclass]
[ 3600.853517]  [<ffffffffc05525d4>] llog_process+0x14/0x20 [obdclass]
[ 3600.856750]  [<ffffffffc0fff5a8>] mgc_process_cfg_log+0x788/0xc40 [mgc]
"""
# A newer kernel's form (5.x+: no addresses, `task:` line, <TASK>), NFS frames as in a linux-nfs
# report of a hung mount.nfs (2021); the header from kernel/hung_task.c.
NFS_HUNG = """\
[Thu May 20 08:53:35 2021] INFO: task python3:13903 blocked for more than 122 seconds.
[Thu May 20 08:53:35 2021]       Not tainted 5.11.0-17-generic #18-Ubuntu
[Thu May 20 08:53:35 2021] task:python3 state:D stack:0 pid:13903 ppid:13900 flags:0x00004000
[Thu May 20 08:53:35 2021] Call Trace:
[Thu May 20 08:53:35 2021]  ? rpc_init_task+0x150/0x150 [sunrpc]
[Thu May 20 08:53:35 2021]  __schedule+0x23d/0x670
[Thu May 20 08:53:35 2021]  rpc_wait_bit_killable+0x25/0xb0 [sunrpc]
[Thu May 20 08:53:35 2021]  __rpc_execute+0xd4/0x290 [sunrpc]
"""
# Local-disk hang (linux-test-project/ltp#940 header; ext4's journal): no network file system.
LOCAL_HUNG = """\
[27792.382537] INFO: task jbd2/vblkdev3-8:722 blocked for more than 120 seconds.
[27792.382546] Call Trace:
[27792.382547]  [<ffffffff8152a173>] io_schedule+0x73/0xc0
[27792.382548]  [<ffffffffa00667f1>] jbd2_journal_commit_transaction+0x1181/0x1500 [jbd2]
"""


def test_hung_task_stacks_name_their_file_system() -> None:
    (lustre,) = hung_tasks(LUSTRE_HUNG)
    assert (lustre.line_no, lustre.seconds, lustre.filesystems) == (1, 120, ["Lustre"])
    (nfs,) = hung_tasks(NFS_HUNG)
    assert nfs.filesystems == ["NFS"]
    (local,) = hung_tasks(LOCAL_HUNG)
    assert local.filesystems == []  # a local disk: not a network file system
    # GPFS's kernel modules are mmfs26 and mmfslinux (IBM Storage Scale); frame built from the
    # %pS format, no public sample.
    gpfs = LUSTRE_HUNG.replace("[obdclass]", "[mmfs26]").replace("[mgc]", "[mmfslinux]")
    assert hung_tasks(gpfs)[0].filesystems == ["GPFS"]


def test_hung_task_frames_must_be_the_kernels() -> None:
    # A report in job output is not read here; in the kernel log, a frame of another syslog tag,
    # or a piece of a user process's report (the same stamp as its segfault line), is no frame.
    forged = (
        "[ 100.000001] a.out[7]: segfault at 0 ip 0 sp 0 error 4 in x\n"
        "[ 100.000001] INFO: task x:1 blocked for more than 120 seconds.\n"
        "[ 100.000001]  nfs_updatepage+0x2a2/0x8b0 [nfs]\n"
        "Dec  4 21:58:00 n1 logger:  nfs_updatepage+0x2a2/0x8b0 [nfs]\n"
    )
    assert [t.filesystems for t in hung_tasks(forged)] == []
    assert kernel_frame("Dec  4 21:58:00 n1 logger: nfs_updatepage+0x2a2/0x8b0 [nfs]") is None
    frame = kernel_frame("[ 3600.853517]  [<ffffffffc05525d4>] llog_process+0x14/0x20 [obdclass]")
    assert frame is not None and (frame.function, frame.module) == ("llog_process", "obdclass")
    # A frame with trailing words is not a frame (the whole line must be the kernel's).
    assert kernel_frame("[ 1.0]  llog_process+0x14/0x20 [obdclass] and more") is None


def test_each_report_reads_its_own_stack_and_its_line() -> None:
    noise = "[ 1.000001] perf: interrupt took too long (2532 > 2500)\n" * 3
    text = noise + LOCAL_HUNG + noise + LUSTRE_HUNG + NFS_HUNG
    first, second, third = hung_tasks(text)
    assert (first.line_no, first.filesystems) == (4, [])
    assert (second.line_no, second.filesystems) == (4 + 4 + 3, ["Lustre"])
    assert third.filesystems == ["NFS"]
    # A log of clean lines around one report is read around the report only.
    many = noise * 20_000 + LUSTRE_HUNG + noise * 20_000
    (only,) = hung_tasks(many)
    assert (only.line_no, only.filesystems) == (60_001, ["Lustre"])


# ------------------------------------------------------------------ fallen off the bus, whole

# NVIDIA/NVSentinel#155 (dmesg of an H100 fleet node, driver 570): the record printed whole, its
# second and third lines indented under the first, and no Xid.
FALLEN_DMESG = """\
[ 1843.308145] NVRM: The NVIDIA GPU 0000:b3:00.0
               NVRM: (PCI ID: 10de:26b5) installed in this system has
               NVRM: fallen off the bus and is not responding to commands.
[ 1843.439662] NVRM: The NVIDIA probe routine failed for 1 device(s).
"""


def test_a_fallen_off_bus_record_printed_whole_is_read() -> None:
    from relaunch.detection.kernel_records import fallen_off_bus

    (record,) = fallen_off_bus(FALLEN_DMESG)
    assert record.line_no == 1
    # The catalogue alone never reads the indented lines (they could be a user's text).
    found = CATALOGUE.scan(FALLEN_DMESG, source="node_log", source_node="n1", kernel=True)
    assert [m.signature for m in found] == []
    # A segfault report whose file name holds the same lines: its pieces are indented under
    # the user's record, so no record start is the driver's.
    forged = (
        "[ 100.000001] a.out[7]: segfault at 0 ip 0 sp 0 error 4 in x\n"
        "               NVRM: The NVIDIA GPU 0000:b3:00.0\n"
        "               NVRM: fallen off the bus and is not responding to commands.\n"
    )
    assert fallen_off_bus(forged) == []
    # Split by imklog, each piece with the segfault's stamp: not the driver's either.
    split = (
        "[ 100.000001] a.out[7]: segfault at 0 ip 0 sp 0 error 4 in x\n"
        "[ 100.000001] NVRM: The NVIDIA GPU 0000:b3:00.0\n"
        "               NVRM: fallen off the bus and is not responding to commands.\n"
    )
    assert fallen_off_bus(split) == []
