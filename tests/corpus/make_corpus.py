#!/usr/bin/env python3
"""Write the labelled incident-bundle corpus under tests/corpus/ (deterministic).

Run from the repository root: ``python tests/corpus/make_corpus.py``. Each scenario below builds
one bundle from the line formats of docs/failure-signatures.md (helpers in ``_lib.py``) and its
label (expected.json) from that document's rules (§1.1, §1.2, §3). See README.md.
"""

from __future__ import annotations

import json
import shutil
import sys
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _lib import GSP_BANNER, TORCH, Job, Spec, iso, t, tel_healthy, xid  # noqa: E402

HERE = Path(__file__).resolve().parent
S = timedelta(seconds=1)
M = timedelta(minutes=1)


def tasks(lst: list[int]) -> str:
    lst = sorted(lst)
    if len(lst) == 1:
        return f"task {lst[0]}"
    runs, start, prev = [], lst[0], lst[0]
    for x in lst[1:] + [None]:
        if x is not None and x == prev + 1:
            prev = x
            continue
        runs.append(f"{start}-{prev}" if prev != start else f"{start}")
        if x is not None:
            start = prev = x
    return "tasks " + ",".join(runs)


def cascade(
    J: Job, ranks: list[int], when, kind: str = "timeout", seq: int = 4521, op: str = "ALLREDUCE"
) -> None:
    """One cascade burst per surviving rank (§1.1): timeouts, remote-exit, store errors."""
    for i, r in enumerate(ranks):
        w = when + timedelta(milliseconds=37 * i + J.rng.randint(0, 900))
        k = kind if kind != "mixed" else ("timeout", "remote", "dist")[J.rng.randint(0, 2)]
        if k == "timeout":
            J.wd_timeout(r, w, seq, op)
        elif k == "remote":
            J.remote_exit(r, w)
        elif k == "dist":
            J.dist_backend(r, "remote process exited or there was a network error")
        if kind == "mixed" and J.rng.random() < 0.4:
            J.tcpstore(r, w + S, J.rng.randint(0, 1))


def srun_tail(
    J: Job,
    first: tuple[str, list[int], str],
    when,
    others_msg: str | None = None,
    cancel_on: str | None = None,
    abort: bool = True,
    exclude: tuple = (),
) -> None:
    node, tl, msg = first
    J.srun(f"error: {node}: {tasks(tl)}: {msg}")
    if abort:
        J.srun("Job step aborted: Waiting up to 32 seconds for job step to finish.")
    if cancel_on:
        J.stepd(f"STEP {J.job_id}.0 ON {cancel_on} CANCELLED AT {iso(when)}")
    if others_msg:
        per_task = J.layout == "per_gpu"
        for n in J.nodes:
            if n == node or n in exclude:
                continue
            ts = J.ranks_on(n) if per_task else [J.nodes.index(n)]
            ts = [x for x in ts if x not in tl]
            if ts:
                J.srun(f"error: {n}: {tasks(ts)}: {others_msg}")


def others(J: Job, skip: list[int]) -> list[int]:
    return [r for r in range(J.world) if r not in skip]


# =========================================================================================
# gpu_hardware
# =========================================================================================
def g_xid79_cascade(seed: int) -> Spec:
    J = Job(
        seed,
        cluster="atlas",
        job_id="1184231",
        nodes=["gpu01", "gpu02", "gpu03", "gpu04"],
        start=t("2026-03-14 01:12:40"),
    )
    J.setup("/lustre/ckpt/gpt-13b/", 42000, 120000)
    now = J.megatron(J.start + 90 * S, 42000, 120000, 40, 30.0)
    fail = now + 12 * S
    nl = J.nlog("gpu03", "raw")
    nl.kern(fail, xid("0002:00:00", 79, pid=1582259, name="nvc:[driver]"))
    for n in ("gpu01", "gpu02", "gpu04"):
        J.nlog(n, "raw")
    J.watchdog_exc(19, fail + 2 * S, "CUDA error: unspecified launch failure")
    cascade(J, others(J, [19]), fail + 601 * S, "timeout", seq=84211)
    srun_tail(
        J,
        ("gpu03", [19], "Exited with exit code 1"),
        fail + 603 * S,
        "Aborted (core dumped)",
        cancel_on="gpu01",
    )
    return J.spec(
        "xid79-fallen-off-bus-cascade",
        "gpu_hardware",
        ["gpu03"],
        "gpu03's kernel log has Xid 79 (GPU has fallen off the bus) seconds before "
        "rank 19 (ranks map: gpu03) reports an unspecified launch failure; the 31 "
        "watchdog timeouts ten minutes later are cascade and 'ON gpu01' is only the "
        "reporter.",
        state="FAILED",
        exit_code="1:0",
        reason="NonZeroExitCode",
        end=fail + 640 * S,
        sections="§1.1, §1.2, §2.1, §2.8 (Xid 79), §2.12, §3.4",
        tags=["cascade", "map", "srun-l"],
    )


def g_xid48_ecc(seed: int) -> Spec:
    J = Job(
        seed,
        cluster="orion",
        job_id="77120",
        nodes=["gpu-b06", "gpu-b07"],
        layout="torchrun",
        srun_l=False,
        start=t("2026-01-22 18:40:05"),
        pt="old",
        nccl="2.19.3",
        script="train_llama.py",
        fqdn="orion.hpc.example.org",
    )
    J.setup()
    now = J.steps(J.start + 60 * S, 1, 120, 4.2, ranks=[0])
    fail = now + 3 * S
    nl = J.nlog("gpu-b07", "bsd")
    nl.kern(fail - 1 * S, xid("0000:07:00", 48, pid="unknown"))
    J.nlog("gpu-b06", "bsd")
    J.cuda_error(13, "uncorrectable ECC error encountered")
    cascade(J, others(J, [13]), fail + 4 * S, "remote")
    J.child_failed(
        "gpu-b07",
        [
            (
                13,
                1,
                fail,
                "To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html",
            )
        ]
        + [
            (r, -6, fail + 5 * S, f"Signal 6 (SIGABRT) received by PID {J.pid[r]}")
            for r in (8, 9, 10)
        ],
        rule=54,
    )
    J.child_failed(
        "gpu-b06",
        [
            (r, -6, fail + 5 * S, f"Signal 6 (SIGABRT) received by PID {J.pid[r]}")
            for r in (0, 1, 2)
        ],
        rule=54,
    )
    J.srun("error: gpu-b07: task 1: Exited with exit code 1")
    J.srun("error: gpu-b06: task 0: Exited with exit code 1")
    return J.spec(
        "xid48-dbe-ecc-torchrun",
        "gpu_hardware",
        ["gpu-b07"],
        "gpu-b07's kernel log has Xid 48 (double-bit ECC) one second before rank 13 "
        "(gpu-b07) raises 'CUDA error: uncorrectable ECC error encountered'; the "
        "remote-exit lines on the other ranks are cascade.",
        state="FAILED",
        exit_code="1:0",
        reason="NonZeroExitCode",
        end=fail + 8 * S,
        sections="§2.3, §2.5, §2.8 (Xid 48), §3.15",
        tags=["cascade", "map", "fqdn"],
    )


def g_xid95_nomap(seed: int) -> Spec:
    nodes = [f"hgx-c{i:02d}" for i in range(1, 9)]
    J = Job(
        seed,
        cluster="vega",
        job_id="5503318",
        nodes=nodes,
        layout="torchrun",
        ranks_map=False,
        start=t("2026-05-02 07:00:11"),
        nccl="2.23.4",
    )
    J.setup("/scratch/ckpt/moe-47b/", 8800, 50000)
    now = J.megatron(J.start + 150 * S, 8800, 50000, 60, 22.0)
    fail = now + 8 * S
    nl = J.nlog("hgx-c06", "iso")
    nl.kern(fail, xid("0000:9a:00", 95, pid=7062, name="python3"))
    nl.kern(fail + 1 * S, xid("0000:9a:00", 154, pid=None))
    J.nlog("hgx-c02", "iso")
    J.watchdog_exc(44, fail + 1 * S, "CUDA error: an illegal memory access was encountered")
    cascade(
        J,
        others(J, list(range(40, 48))),
        fail + 602 * S,
        "timeout",
        seq=19077,
        op="_ALLGATHER_BASE",
    )
    J.srun("error: hgx-c06: task 5: Exited with exit code 1")
    J.srun("error: hgx-c[01-05,07-08]: tasks 0-4,6-7: Exited with exit code 1")
    return J.spec(
        "xid95-uncontained-no-rank-map",
        "gpu_hardware",
        ["hgx-c06"],
        "hgx-c06's kernel log has Xid 95 (uncontained memory error) and Xid 154 'GPU "
        "Reset Required' at the failure; the illegal-memory-access on rank 44 comes "
        "from srun task 5 = hgx-c06 (one task per node, no map), so it is not an "
        "application error.",
        state="FAILED",
        exit_code="1:0",
        reason="NonZeroExitCode",
        end=fail + 610 * S,
        sections="§1.2 (srun -l, one task per node), §2.3, §2.8 (Xid 95, 154)",
        tags=["cascade", "nomap", "srun-l"],
    )


def g_xid74_nvlink(seed: int) -> Spec:
    J = Job(
        seed,
        cluster="atlas",
        job_id="1190044",
        nodes=["gpu09", "gpu10"],
        start=t("2026-03-19 13:20:00"),
    )
    J.setup()
    now = J.steps(J.start + 45 * S, 2200, 90, 5.0, ranks=[0, 8])
    fail = now + 2 * S
    nl = J.nlog("gpu10", "journal")
    nl.kern(fail - 1 * S, xid("0000:5d:00", 74, pid="unknown"))
    J.nlog("gpu09", "journal")
    J.watchdog_exc(
        11,
        fail,
        "CUDA error: Invalid access of peer GPU memory over nvlink or a hardware error",
        teardown=False,
    )
    J.say(11, "Fatal Python error: Aborted")
    cascade(J, others(J, [11]), fail + 600 * S, "timeout", seq=3310)
    srun_tail(
        J,
        ("gpu10", [11], "Aborted (core dumped)"),
        fail + 601 * S,
        "Aborted (core dumped)",
        cancel_on="gpu09",
    )
    return J.spec(
        "xid74-nvlink-peer-access",
        "gpu_hardware",
        ["gpu10"],
        "gpu10 logs Xid 74 (NVLink fatal error) and its rank 11 reports 'Invalid access "
        "of peer GPU memory over nvlink or a hardware error'; the 15 watchdog timeouts "
        "are cascade.",
        state="FAILED",
        exit_code="0:6",
        reason="NonZeroExitCode",
        end=fail + 610 * S,
        sections="§2.1 (peer-memory case), §2.3, §2.8 (Xid 74)",
        tags=["cascade", "map", "srun-l"],
    )


def g_xid119_single(seed: int) -> Spec:
    nodes = [f"node{i:03d}" for i in range(41, 45)]
    J = Job(
        seed,
        cluster="polaris",
        job_id="332190",
        nodes=nodes,
        start=t("2026-02-08 22:05:30"),
        nccl="2.26.2",
        nccl_debug="WARN",
    )
    J.setup("/gpfs/ckpt/run7/", 1200, 30000)
    now = J.megatron(J.start + 60 * S, 1200, 30000, 30, 18.0)
    fail = now + 5 * S
    nl = J.nlog("node043", "iso")
    nl.kern(fail, xid("0000:17:00", 119, pid=15822502, name="nvc:[driver]"))
    nl.kern(fail, GSP_BANNER)
    for n in ("node041", "node042", "node044"):
        J.nlog(n, "iso")
    J.c10(
        20,
        fail + 480 * S,
        "E",
        1484,
        "ProcessGroupNCCL's watchdog got stuck for 480 seconds "
        "without making progress in monitoring enqueued collectives. This typically indicates "
        "a NCCL/CUDA API (e.g., CudaEventDestroy) hang blocking the watchdog, and could be "
        "triggered by another thread holding the GIL inside a CUDA api (for example, "
        "CudaEventDestroy), or other deadlock-prone behaviors.",
        pg=True,
    )
    cascade(J, others(J, list(range(16, 24))), fail + 600 * S, "timeout", seq=7781)
    srun_tail(
        J,
        ("node041", list(range(0, 8)), "Aborted (core dumped)"),
        fail + 602 * S,
        "Aborted (core dumped)",
        cancel_on="node041",
        exclude=("node043",),
    )
    J.srun("error: Timed out waiting for job step to complete")
    return J.spec(
        "xid119-gsp-timeout-one-node",
        "gpu_hardware",
        ["node043"],
        "node043 alone logs Xid 119 (GSP RPC timeout) and its rank 20 then reports "
        "the watchdog stuck for 480 s; one node, no driver change, so the GPU is at "
        "fault, and the first srun line (node041) is only teardown.",
        state="FAILED",
        exit_code="0:6",
        reason="NonZeroExitCode",
        end=fail + 660 * S,
        sections="§2.1 (watchdog stuck), §2.8 (Xid 119), §1.2 (first srun line)",
        tags=["cascade", "map", "srun-l"],
    )


def g_xid64_rowremap(seed: int) -> Spec:
    J = Job(
        seed,
        cluster="orion",
        job_id="80411",
        nodes=["gpu-a01", "gpu-a02", "gpu-a03"],
        start=t("2026-04-11 03:33:03"),
        rank_prefix=False,
        pt="old",
        nccl="2.19.3",
    )
    J.setup()
    now = J.steps(J.start + 40 * S, 500, 70, 6.0, ranks=[0])
    fail = now + 4 * S
    nl = J.nlog("gpu-a02", "caller")
    nl.kern(fail - 40 * M, xid("0000:3a:00", 63, pid=1896, name="python3"))
    nl.kern(fail, xid("0000:3a:00", 64, pid="unknown"))
    nl.kern(fail + 1 * S, xid("0000:3a:00", 154))
    J.cuda_error(10, "uncorrectable ECC error encountered")
    cascade(J, others(J, [10]), fail + 5 * S, "dist")
    srun_tail(
        J,
        ("gpu-a02", [10], "Exited with exit code 1"),
        fail + 9 * S,
        "Exited with exit code 1",
        cancel_on="gpu-a01",
    )
    return J.spec(
        "xid64-row-remap-failure",
        "gpu_hardware",
        ["gpu-a02"],
        "gpu-a02 logs Xid 64 (row-remap failure, synthetic text) and Xid 154 'GPU "
        "Reset Required' on the GPU of rank 10, which reports an uncorrectable ECC "
        "error; the earlier Xid 63 on the same GPU is only informational.",
        state="FAILED",
        exit_code="1:0",
        reason="NonZeroExitCode",
        end=fail + 12 * S,
        sections="§2.8 (Xid 63, 64, 154), §2.3, §3.8",
        tags=["cascade", "map"],
    )


def g_ecc_telemetry_only(seed: int) -> Spec:
    nodes = ["gpu05", "gpu06", "gpu07", "gpu08"]
    J = Job(
        seed, cluster="atlas", job_id="1201777", nodes=nodes, start=t("2026-03-27 09:00:00"), gpn=4
    )
    J.setup("/lustre/ckpt/vit-g/", 9000, 40000)
    now = J.megatron(J.start + 80 * S, 9000, 40000, 25, 12.0)
    fail = now + 6 * S
    cascade(J, others(J, [9]), fail + 600 * S, "timeout", seq=22018)
    srun_tail(
        J,
        ("gpu07", [9], "Aborted (core dumped)"),
        fail + 602 * S,
        "Aborted (core dumped)",
        cancel_on="gpu05",
    )
    tel = tel_healthy(J, fail - 5 * M) + tel_healthy(J, fail + 1 * M)
    for s in tel:
        if s["node"] == "gpu07" and s["gpu"] == 1 and s["time"] > iso(fail):
            s["ecc_dbe_volatile"] = 2
    return J.spec(
        "ecc-dbe-telemetry-only",
        "gpu_hardware",
        ["gpu07"],
        "Telemetry shows ecc_dbe_volatile=2 on gpu07 GPU 1 (rank 9's GPU) right after "
        "the last progress, zero everywhere else (DCGM_FR_VOLATILE_DBE_DETECTED); the "
        "log holds only cascade timeouts from the other ranks.",
        state="FAILED",
        exit_code="0:6",
        reason="NonZeroExitCode",
        end=fail + 605 * S,
        telemetry=tel,
        sections="§2.9 (DBE), §1.1",
        tags=["cascade", "map", "srun-l", "telemetry"],
    )


def g_offbus_three_lines(seed: int) -> Spec:
    nodes = ["hgx-03", "hgx-04", "hgx-05"]
    J = Job(
        seed,
        cluster="vega",
        job_id="5510020",
        nodes=nodes,
        layout="torchrun",
        srun_l=False,
        start=t("2026-05-06 16:45:51"),
        fqdn="vega.cluster.example.com",
        script="finetune.py",
    )
    J.setup()
    now = J.steps(J.start + 30 * S, 1, 200, 2.5, ranks=[0])
    fail = now + 2 * S
    nl = J.nlog("hgx-03", "dmesg")
    nl.kern(fail, "NVRM: The NVIDIA GPU 0000:b3:00.0")
    nl.kern(fail, "NVRM: (PCI ID: 10de:26b5) installed in this system has")
    nl.kern(fail, "NVRM: fallen off the bus and is not responding to commands.")
    nl.kern(fail + 20 * S, "NVRM: GPU 0000:b3:00.0: RmInitAdapter failed! (0x22:0x40:894)")
    J.nlog("hgx-05", "dmesg")
    cascade(J, others(J, [6]), fail + 600 * S, "mixed", seq=1803)
    J.child_failed(
        "hgx-03", [(6, -6, fail + 601 * S, f"Signal 6 (SIGABRT) received by PID {J.pid[6]}")]
    )
    for n in ("hgx-04", "hgx-05"):
        r0 = J.ranks_on(n)[0]
        J.child_failed(
            n, [(r0, -6, fail + 602 * S, f"Signal 6 (SIGABRT) received by PID {J.pid[r0]}")]
        )
    return J.spec(
        "fallen-off-bus-three-nvrm-lines",
        "gpu_hardware",
        ["hgx-03"],
        "hgx-03's kernel log reports GPU 0000:b3:00.0 'fallen off the bus' split over "
        "three NVRM lines with no Xid, then RmInitAdapter failed; every job-log line is "
        "cascade, and the torchrun host fields are FQDNs of the allocation.",
        state="FAILED",
        exit_code="1:0",
        reason="NonZeroExitCode",
        end=fail + 610 * S,
        sections="§2.8 (off the bus without an Xid), §3.7, §2.5, §3.21",
        tags=["cascade", "map", "fqdn"],
    )


def g_multi_79_48(seed: int) -> Spec:
    nodes = ["gpu01", "gpu02", "gpu03", "gpu04"]
    J = Job(seed, cluster="atlas", job_id="1211930", nodes=nodes, start=t("2026-04-02 00:10:10"))
    J.setup("/lustre/ckpt/gpt-70b/", 3000, 90000)
    now = J.megatron(J.start + 120 * S, 3000, 90000, 35, 40.0)
    fail = now + 10 * S
    J.nlog("gpu02", "iso").kern(fail, xid("0000:18:00", 79, pid=None))
    J.nlog("gpu04", "iso").kern(fail + 95 * S, xid("0000:ba:00", 48, pid="unknown"))
    J.nlog("gpu01", "iso")
    J.nlog("gpu03", "iso")
    J.watchdog_exc(8, fail + 1 * S, "CUDA error: unspecified launch failure")
    J.cuda_error(30, "uncorrectable ECC error encountered")
    cascade(J, others(J, [8, 30]), fail + 600 * S, "timeout", seq=51220)
    srun_tail(
        J,
        ("gpu02", [8], "Exited with exit code 1"),
        fail + 604 * S,
        "Aborted (core dumped)",
        cancel_on="gpu01",
    )
    return J.spec(
        "multi-xid79-gpu02-xid48-gpu04",
        "gpu_hardware",
        ["gpu02", "gpu04"],
        "Two independent hardware roots: Xid 79 on gpu02 (rank 8's GPU) and, 95 s "
        "later, Xid 48 on gpu04 with rank 30's uncorrectable ECC error; both nodes "
        "must be drained.",
        state="FAILED",
        exit_code="1:0",
        reason="NonZeroExitCode",
        end=fail + 620 * S,
        sections="§1.2, §2.8 (Xid 79, 48), §3.18",
        tags=["cascade", "multi", "map", "srun-l"],
    )


def g_multi_sxid_xid95(seed: int) -> Spec:
    nodes = [f"dgx-a{i:03d}" for i in (9, 10, 11, 12, 13, 14)]
    J = Job(
        seed,
        cluster="titan",
        job_id="9902113",
        nodes=nodes,
        layout="torchrun",
        start=t("2026-06-14 05:55:00"),
        nccl="2.27.3",
    )
    J.setup("/lustre/ckpt/mm-34b/", 12500, 80000)
    now = J.megatron(J.start + 100 * S, 12500, 80000, 30, 25.0)
    fail = now + 9 * S
    J.nlog("dgx-a011", "dmesg").kern(
        fail,
        "nvidia-nvswitch0: SXid (PCI:0000:c3:00.0): 24007, "
        "Fatal, Link 28 sourcetrack timeout error (First)",
    )
    nl = J.nlog("dgx-a014", "iso")
    nl.kern(fail + 20 * S, xid("0004:01:00", 95, pid=88211, name="python"))
    J.nlog("dgx-a010", "dmesg").kern(
        fail - 30 * M,
        "nvidia-nvswitch2: SXid (PCI:0000:06:00.0): 20009, Non-fatal, Link 04 RX Short Error Rate",
    )
    cascade(J, others(J, []), fail + 600 * S, "timeout", seq=40040)
    J.srun("error: dgx-a[009-014]: tasks 0-5: Exited with exit code 1")
    return J.spec(
        "multi-sxid-fatal-and-xid95",
        "gpu_hardware",
        ["dgx-a011", "dgx-a014"],
        "dgx-a011 logs a Fatal NVSwitch SXid 24007 and dgx-a014 an Xid 95 within 20 s "
        "of the stall; the Non-fatal SXid on dgx-a010 is only supporting evidence, and "
        "all 48 ranks time out as cascade.",
        state="FAILED",
        exit_code="1:0",
        reason="NonZeroExitCode",
        end=fail + 610 * S,
        sections="§2.10 (SXid Fatal/Non-fatal), §2.8 (Xid 95)",
        tags=["cascade", "multi", "map", "srun-l", "red-herring"],
    )


def g_xid94_single(seed: int) -> Spec:
    J = Job(
        seed,
        cluster="polaris",
        job_id="334871",
        nodes=["node050", "node051"],
        start=t("2026-02-15 10:00:00"),
    )
    J.setup()
    now = J.steps(J.start + 30 * S, 10, 60, 5.0, ranks=[0, 8])
    fail = now + 3 * S
    J.nlog("node051", "journal").kern(fail, xid("0000:17:00", 94, pid=789012, name="python3"))
    J.nlog("node050", "journal")
    J.cuda_error(12, "uncorrectable ECC error encountered")
    cascade(J, others(J, [12]), fail + 2 * S, "dist")
    srun_tail(
        J,
        ("node051", [12], "Exited with exit code 1"),
        fail + 5 * S,
        "Exited with exit code 1",
        cancel_on="node050",
    )
    return J.spec(
        "xid94-contained-single",
        "gpu_hardware",
        [],
        "A single Xid 94 (contained ECC error) on node051 explains rank 12's ECC error:"
        " a hardware memory event contained to this application, so restart without "
        "isolating and without holding (§3.9), hence no culprit.",
        state="FAILED",
        exit_code="1:0",
        reason="NonZeroExitCode",
        end=fail + 8 * S,
        sections="§2.8 (Xid 94), §3.9",
        tags=["cascade", "map", "srun-l"],
    )


def g_xid94_repeat(seed: int) -> Spec:
    J = Job(
        seed,
        cluster="polaris",
        job_id="335002",
        nodes=["node052", "node053"],
        start=t("2026-02-16 06:00:00"),
    )
    J.setup()
    now = J.steps(J.start + 30 * S, 10, 60, 5.0, ranks=[0])
    fail = now + 3 * S
    nl = J.nlog("node053", "iso")
    for back in (19 * 60, 7 * 60, 0):
        nl.kern(
            fail - back * M if back else fail,
            xid("0000:9a:00", 94, pid=J.rng.randint(100000, 900000), name="python3"),
        )
    J.nlog("node052", "iso")
    J.cuda_error(12, "uncorrectable ECC error encountered")
    cascade(J, others(J, [12]), fail + 2 * S, "remote")
    srun_tail(
        J,
        ("node053", [12], "Exited with exit code 1"),
        fail + 5 * S,
        "Aborted (core dumped)",
        cancel_on="node052",
    )
    return J.spec(
        "xid94-repeated-same-gpu",
        "gpu_hardware",
        ["node053"],
        "Xid 94 on node053 PCI 0000:9a:00 for the third time in 19 h (same GPU, the "
        "one under rank 12's ECC error): repeats on one GPU make it gpu_hardware (§3.9).",
        state="FAILED",
        exit_code="1:0",
        reason="NonZeroExitCode",
        end=fail + 8 * S,
        sections="§2.8 (Xid 94), §3.9, §3.10",
        tags=["cascade", "map", "srun-l"],
    )


def g_xid79_red_herrings(seed: int) -> Spec:
    nodes = ["gpu11", "gpu12", "gpu13", "gpu14"]
    J = Job(
        seed,
        cluster="atlas",
        job_id="1220418",
        nodes=nodes,
        start=t("2026-04-20 20:00:00"),
        nccl_debug="INFO",
        nccl="2.21.5",
    )
    J.nccl_init()
    J.setup("/lustre/ckpt/gpt-13b-b/", 60000, 120000)
    now = J.megatron(J.start + 60 * S, 60000, 120000, 20, 30.0)
    flap = now
    J.nccl_warn(
        17,
        flap,
        "transport/net_ib.cc:253",
        "NET/IB : mlx5_3:1 Got non-fatal async event: port error(10)",
    )
    now = J.megatron(now + 30 * S, 60200, 120000, 40, 30.0)
    fail = now + 4 * S
    nl = J.nlog("gpu14", "raw")
    nl.kern(fail, xid("0000:db:00", 79, pid=None))
    J.nlog("gpu13", "bsd").kern(
        flap - 2 * S, "NETDEV WATCHDOG: eth0 (mlx5_core): transmit queue 0 timed out", level=4
    )
    J.nlog("gpu12", "bsd").kern(
        J.start - 26 * 60 * M, xid("0000:10:1c", 63, pid=1896, name="python3")
    )
    tel = [{"node": "gpu14", "gpu": 7, "time": iso(fail) + "Z", "xid": 79}]
    tel += tel_healthy(J, fail - 2 * M, ["gpu11", "gpu12", "gpu13"])
    cascade(J, others(J, [31]), fail + 600 * S, "timeout", seq=99812)
    srun_tail(
        J,
        ("gpu11", list(range(0, 8)), "Aborted (core dumped)"),
        fail + 601 * S,
        "Aborted (core dumped)",
        cancel_on="gpu11",
    )
    return J.spec(
        "xid79-with-red-herrings",
        "gpu_hardware",
        ["gpu14"],
        "Xid 79 on gpu14 (kernel log and telemetry) at the stall is the root; the "
        "recovered port-error flap on gpu13, gpu12's day-old Xid 63, the first srun "
        "line naming gpu11 and 'ON gpu11' are all red herrings.",
        state="FAILED",
        exit_code="0:6",
        reason="NonZeroExitCode",
        end=fail + 620 * S,
        telemetry=tel,
        sections="§2.2, §2.8 (Xid 63, 79), §3.4, §3.8, §3.17",
        tags=["cascade", "map", "srun-l", "red-herring", "telemetry", "nccl-info"],
    )


# =========================================================================================
# network
# =========================================================================================
def _ib_job(seed: int, job_id: str, nodes: list[str], start: str, debug: str | None) -> Job:
    J = Job(
        seed,
        cluster="helix",
        job_id=job_id,
        nodes=nodes,
        gpn=4,
        start=t(start),
        nccl_debug=debug,
        nccl="2.19.3",
        pt="old",
    )
    if debug == "INFO":
        J.nccl_init()
    J.setup("/weka/ckpt/llm-8b/", 2000, 20000)
    return J


def n_ib_peer_mapped(seed: int) -> Spec:
    nodes = ["ib-n01", "ib-n02", "ib-n03", "ib-n04"]
    J = _ib_job(seed, "430117", nodes, "2026-02-21 14:00:00", "INFO")
    now = J.megatron(J.start + 60 * S, 2000, 20000, 40, 9.0)
    fail = now + 3 * S
    peer = J.ip["ib-n04"]
    for r in (1, 6, 9):
        J.nccl_warn(
            r,
            fail + 7 * S,
            "transport/net_ib.cc:1420",
            f"NET/IB : Got completion from peer {peer}<{J.rng.randint(30000, 60000)}> "
            f"with error 12, opcode 0, len 0, vendor err 129",
        )
    for r in (2, 5, 10, 3):
        J.nccl_warn(
            r,
            fail + 8 * S,
            "transport/net_ib.cc:1420",
            f"NET/IB : Got completion from peer {peer}<{J.rng.randint(30000, 60000)}> "
            f"with error 5, opcode 0, len 0, vendor err 249",
        )
    cascade(J, others(J, [12, 13, 14, 15]), fail + 9 * S, "remote")
    srun_tail(
        J,
        ("ib-n01", [1], "Aborted (core dumped)"),
        fail + 12 * S,
        "Aborted (core dumped)",
        cancel_on="ib-n01",
    )
    return J.spec(
        "ib-retry-exceeded-peer-mapped",
        "network",
        ["ib-n04"],
        "Three ranks on three nodes get 'Got completion from peer 10.x with error 12' "
        "(transport retries exhausted) for the same peer IP, which the NCCL Bootstrap "
        "INFO line maps to ib-n04; the reporter is not the suspect (§1.2).",
        state="FAILED",
        exit_code="0:6",
        reason="NonZeroExitCode",
        end=fail + 15 * S,
        sections="§1.2 (NCCL prefix; peer), §2.2 (error 12 / error 5)",
        tags=["cascade", "map", "srun-l", "nccl-info"],
        job_only=True,
    )


def n_ib_peer_corroborated(seed: int) -> Spec:
    nodes = ["ib-n11", "ib-n12", "ib-n13"]
    J = _ib_job(seed, "430590", nodes, "2026-02-23 02:30:00", "INFO")
    now = J.megatron(J.start + 60 * S, 2000, 20000, 30, 9.0)
    fail = now + 2 * S
    J.nlog("ib-n12", "iso").kern(
        fail - 3 * S,
        "mlx5_core 0000:d2:00.0: poll_health:825: "
        "device's health compromised - reached miss count.",
    )
    J.nlog("ib-n11", "iso")
    J.nlog("ib-n13", "iso")
    peer = J.ip["ib-n12"]
    J.nccl_warn(
        9,
        fail + 6 * S,
        "transport/net_ib.cc:1420",
        f"NET/IB : Got completion from peer {peer}<51234> with error 12, opcode 0, len "
        "0, vendor err 129",
    )
    cascade(J, others(J, [4, 5, 6, 7]), fail + 7 * S, "dist")
    srun_tail(
        J,
        ("ib-n13", [9], "Exited with exit code 1"),
        fail + 10 * S,
        "Exited with exit code 1",
        cancel_on="ib-n11",
    )
    return J.spec(
        "ib-retry-peer-mlx5-health",
        "network",
        ["ib-n12"],
        "ib-n12's kernel log shows 'mlx5_core ... device's health compromised' just "
        "before ib-n13 gets error 12 from ib-n12's IP; the first srun line (ib-n13) is "
        "the reporter, not the culprit.",
        state="FAILED",
        exit_code="1:0",
        reason="NonZeroExitCode",
        end=fail + 14 * S,
        sections="§2.11 (fatal mlx5), §2.2, §1.2",
        tags=["cascade", "map", "srun-l", "nccl-info"],
    )


def n_ib_reporter_only(seed: int) -> Spec:
    nodes = ["ib-n21", "ib-n22"]
    J = _ib_job(seed, "431004", nodes, "2026-02-25 11:11:11", "WARN")
    now = J.megatron(J.start + 60 * S, 2000, 20000, 30, 9.0)
    fail = now + 2 * S
    J.nccl_warn(
        5,
        fail + 7 * S,
        "transport/net_ib.cc:1420",
        "NET/IB : Got completion from peer 10.77.3.41<46312> with error 12, opcode 0, "
        "len 0, vendor err 129",
    )
    J.dist_backend(
        5,
        "unhandled system error (run with NCCL_DEBUG=INFO for details)",
        "ncclSystemError: System call (e.g. socket, malloc) or external library call "
        "failed or device error.",
    )
    cascade(J, others(J, [5]), fail + 8 * S, "remote")
    srun_tail(J, ("ib-n22", [5], "Exited with exit code 1"), fail + 10 * S, "Aborted (core dumped)")
    return J.spec(
        "ib-retry-reporter-only",
        "network",
        [],
        "Only ib-n22 reports error 12 (retries exhausted) from peer 10.77.3.41, an IP "
        "no line maps to a node of the job: the fault is on the link or either side "
        "and the reporter is not the suspect (§1.2), so no node can be blamed.",
        state="FAILED",
        exit_code="1:0",
        reason="NonZeroExitCode",
        end=fail + 12 * S,
        sections="§1.2, §2.2, §3.22",
        tags=["cascade", "map", "srun-l"],
    )


def n_cable_unplugged(seed: int) -> Spec:
    nodes = ["gpu21", "gpu22", "gpu23"]
    J = Job(
        seed,
        cluster="atlas",
        job_id="1230551",
        nodes=nodes,
        start=t("2026-04-28 08:08:08"),
        nccl_debug="WARN",
        nccl="2.26.2",
    )
    J.setup()
    now = J.steps(J.start + 30 * S, 100, 120, 3.0, ranks=[0])
    fail = now + 1 * S
    J.nlog("gpu22", "bsd").kern(
        fail - 1 * S,
        "mlx5_core 0000:41:00.1: Port module event: module 1, Cable unplugged",
        level=4,
    )
    J.nlog("gpu21", "bsd")
    for r in (8, 9, 10, 11):
        J.nccl_warn(
            r,
            fail + 1 * S,
            "transport/net_ib.cc:253",
            "NET/IB : mlx5_1:1 Got non-fatal async event: port error(10)",
        )
    J.nccl_warn(
        9,
        fail + 8 * S,
        "transport/net_ib/p2p.cc:1080",
        f"NET/IB : Got completion from peer {J.ip['gpu23']}<40112> with error 12, "
        "opcode 0, len 0, vendor err 129",
    )
    cascade(J, others(J, [9]), fail + 9 * S, "remote")
    srun_tail(
        J,
        ("gpu22", [9], "Aborted (core dumped)"),
        fail + 11 * S,
        "Aborted (core dumped)",
        cancel_on="gpu21",
    )
    return J.spec(
        "mlx5-cable-unplugged-then-ib-errors",
        "network",
        ["gpu22"],
        "gpu22's kernel log has 'Port module event: module 1, Cable unplugged' and NCCL"
        " IB errors follow on gpu22 itself (port error, then retries exhausted), which "
        "makes the unplug the root (§2.11).",
        state="FAILED",
        exit_code="0:6",
        reason="NonZeroExitCode",
        end=fail + 14 * S,
        sections="§2.11 (Cable unplugged), §2.2, §3.17",
        tags=["cascade", "map"],
    )


def n_mlx5_fatal(seed: int) -> Spec:
    nodes = [f"cn-{i}" for i in (101, 102, 103, 104, 105, 106)]
    J = Job(
        seed,
        cluster="mesa",
        job_id="66012",
        nodes=nodes,
        layout="torchrun",
        srun_l=False,
        rank_prefix=True,
        start=t("2026-07-01 19:00:00"),
        gpn=4,
        script="train.py",
    )
    J.setup()
    now = J.steps(J.start + 20 * S, 1, 150, 3.0, ranks=[0])
    fail = now + 1 * S
    nl = J.nlog("cn-104", "iso")
    nl.kern(fail, "mlx5_core: INFO: synd 0x8: unrecoverable hardware error.")
    nl.kern(
        fail + 30 * S,
        "mlx5_core 0000:03:00.0: wait_func:1195:(pid 1967079): "
        "ENABLE_HCA(0x104) timeout. Will cause a leak of a command resource",
    )
    J.nlog("cn-102", "iso")
    cascade(J, others(J, []), fail + 600 * S, "mixed", seq=7001)
    return J.spec(
        "mlx5-unrecoverable-hardware-error",
        "network",
        ["cn-104"],
        "cn-104's kernel log has the fatal 'mlx5_core: INFO: synd 0x8: unrecoverable "
        "hardware error.' then an ENABLE_HCA timeout at the stall; every rank's error "
        "is cascade.",
        state="FAILED",
        exit_code="1:0",
        reason="NonZeroExitCode",
        end=fail + 610 * S,
        sections="§2.11 (fatal lines), §1.1",
        tags=["cascade", "map"],
    )


def n_async_fatal_reporter(seed: int) -> Spec:
    nodes = ["gpu31", "gpu32"]
    J = Job(
        seed,
        cluster="atlas",
        job_id="1241876",
        nodes=nodes,
        start=t("2026-05-12 12:12:12"),
        nccl_debug="WARN",
        nccl="2.27.3",
    )
    J.setup()
    now = J.steps(J.start + 30 * S, 10, 40, 6.0, ranks=[0, 8])
    fail = now + 2 * S
    J.nccl_warn(
        3,
        fail,
        "transport/net_ib/common.cc:611",
        "NET/IB : mlx5_0:1 async fatal event: local catastrophic error",
    )
    J.dist_backend(
        3,
        "unhandled system error (run with NCCL_DEBUG=INFO for details)",
        "ncclSystemError: System call (e.g. socket, malloc) or external library call "
        "failed or device error.",
    )
    cascade(J, others(J, [3]), fail + 4 * S, "remote")
    srun_tail(
        J,
        ("gpu31", [3], "Exited with exit code 1"),
        fail + 6 * S,
        "Aborted (core dumped)",
        cancel_on="gpu31",
    )
    return J.spec(
        "ib-async-fatal-event-on-reporter",
        "network",
        ["gpu31"],
        "NCCL on gpu31 (host prefix) reports 'NET/IB : mlx5_0:1 async fatal event' "
        "for its own HCA (format-built, §2.2); that is a root on the reporting host.",
        state="FAILED",
        exit_code="1:0",
        reason="NonZeroExitCode",
        end=fail + 8 * S,
        sections="§2.2 (async fatal event), §1.2",
        tags=["cascade", "map", "srun-l"],
        job_only=True,
    )


# =========================================================================================
# node_failure
# =========================================================================================
def f_srun_node_failure(seed: int) -> Spec:
    nodes = ["gpu01", "gpu02", "gpu03", "gpu04"]
    J = Job(seed, cluster="atlas", job_id="1250003", nodes=nodes, start=t("2026-05-20 04:00:00"))
    J.setup("/lustre/ckpt/gpt-13b/", 90000, 120000)
    now = J.megatron(J.start + 60 * S, 90000, 120000, 30, 30.0)
    fail = now + 15 * S
    J.srun("error: Node failure on gpu03")
    cascade(J, [r for r in range(32) if J.node(r) != "gpu03"], fail + 20 * S, "remote")
    J.stepd(
        f"JOB {J.job_id} ON gpu01 CANCELLED AT {iso(fail + 40 * S)} DUE TO NODE FAILURE, "
        "SEE SLURMCTLD LOG FOR DETAILS"
    )
    J.srun("Job step aborted: Waiting up to 32 seconds for job step to finish.")
    for n in ("gpu01", "gpu02", "gpu04"):
        J.nlog(n, "iso")
    return J.spec(
        "node-fail-srun-gpu03",
        "node_failure",
        ["gpu03"],
        "'srun: error: Node failure on gpu03' with job state NODE_FAIL and gpu03 DOWN*;"
        " gpu03 prints nothing (dead), and 'ON gpu01' is only the reporter.",
        state="NODE_FAIL",
        exit_code="0:0",
        reason="NodeDown",
        end=fail + 45 * S,
        node_states={"gpu03": "DOWN*"},
        last_progress=True,
        sections="§1.2, §2.12 (srun Node failure, NODE FAILURE), §2.13, §3.4",
        tags=["cascade", "map", "srun-l", "red-herring"],
    )


def f_state_only(seed: int) -> Spec:
    nodes = [f"a100-{i:02d}" for i in range(1, 7)]
    J = Job(
        seed,
        cluster="mesa",
        job_id="66230",
        nodes=nodes,
        layout="torchrun",
        srun_l=False,
        start=t("2026-07-04 23:50:00"),
        gpn=8,
        pt="old",
        nccl="2.18.1",
    )
    J.setup()
    now = J.steps(J.start + 30 * S, 1, 150, 4.0, ranks=[0])
    fail = now + 5 * S
    cascade(
        J, [r for r in range(48) if J.node(r) != "a100-05"], fail + 600 * S, "timeout", seq=9120
    )
    J.stepd(
        f"JOB {J.job_id} ON a100-01 CANCELLED AT {iso(fail + 700 * S)} DUE TO NODE FAILURE, "
        "SEE SLURMCTLD LOG FOR DETAILS"
    )
    return J.spec(
        "node-fail-state-only",
        "node_failure",
        ["a100-05"],
        "Job NODE_FAIL with a100-05 DOWN+NOT_RESPONDING and absent from the log; the "
        "NODE FAILURE stepd line names only the reporter a100-01, and every other rank "
        "just times out.",
        state="NODE_FAIL",
        exit_code="0:0",
        reason="NodeDown",
        end=fail + 700 * S,
        node_states={"a100-05": "DOWN+NOT_RESPONDING"},
        sections="§2.12, §2.13, §3.4",
        tags=["cascade", "map"],
    )


def f_hostlist_two(seed: int) -> Spec:
    nodes = [f"dgx{i:02d}" for i in range(3, 9)]
    J = Job(
        seed,
        cluster="titan",
        job_id="9911020",
        nodes=nodes,
        start=t("2026-06-20 15:00:00"),
        gpn=2,
        rank_prefix=False,
    )
    J.setup()
    now = J.steps(J.start + 30 * S, 1, 80, 5.0, ranks=list(range(12)))
    fail = now + 3 * S
    J.srun("error: Node failure on dgx[05-06]")
    J.stepd(
        f"JOB {J.job_id} ON dgx03 CANCELLED AT {iso(fail + 30 * S)} DUE TO NODE FAILURE, "
        "SEE SLURMCTLD LOG FOR DETAILS"
    )
    cascade(J, [r for r in range(12) if J.node(r) not in ("dgx05", "dgx06")], fail + 5 * S, "mixed")
    return J.spec(
        "node-fail-hostlist-two-nodes",
        "node_failure",
        ["dgx05", "dgx06"],
        "'srun: error: Node failure on dgx[05-06]' names two nodes (a hostlist), both "
        "DOWN*; the survivors' errors are cascade.",
        state="NODE_FAIL",
        exit_code="0:0",
        reason="NodeDown",
        end=fail + 35 * S,
        node_states={"dgx05": "DOWN*", "dgx06": "DOWN*"},
        sections="§1.2 (hostlist), §2.12, §3.21",
        tags=["cascade", "multi", "map"],
    )


def f_rank0_store(seed: int) -> Spec:
    nodes = ["gpu41", "gpu42", "gpu43", "gpu44"]
    J = Job(
        seed,
        cluster="atlas",
        job_id="1260110",
        nodes=nodes,
        layout="torchrun",
        ranks_map=False,
        start=t("2026-05-25 17:30:00"),
        gpn=8,
    )
    J.setup()
    now = J.steps(J.start + 30 * S, 1, 100, 4.0, ranks=[0])
    fail = now + 4 * S
    for r in range(8, 32):
        J.tcpstore(r, fail + 3 * S, 2)
        J.tcpstore(r, fail + 3 * S, 0)
    J.stepd(
        f"JOB {J.job_id} ON gpu42 CANCELLED AT {iso(fail + 90 * S)} DUE TO NODE FAILURE, "
        "SEE SLURMCTLD LOG FOR DETAILS"
    )
    return J.spec(
        "node-fail-rank0-store-host",
        "node_failure",
        ["gpu41"],
        "The rank-0 node gpu41 (store host) died: every other rank loses the TCPStore "
        "('Failed to recv, got 0 bytes ... remote server shutdown or crash?'), the job "
        "is NODE_FAIL and gpu41 is DOWN*; the stepd line comes from gpu42.",
        state="NODE_FAIL",
        exit_code="0:0",
        reason="NodeDown",
        end=fail + 95 * S,
        node_states={"gpu41": "DOWN*"},
        sections="§2.6 (store lines), §2.12, §2.13, §3.4",
        tags=["cascade", "nomap", "srun-l"],
    )


def f_idle_star(seed: int) -> Spec:
    nodes = ["n-0101", "n-0102", "n-0103"]
    J = Job(
        seed, cluster="polaris", job_id="338870", nodes=nodes, start=t("2026-03-01 09:09:09"), gpn=4
    )
    J.setup()
    now = J.steps(J.start + 30 * S, 1, 50, 6.0, ranks=[0, 4, 8])
    fail = now + 2 * S
    J.srun("error: Node failure on n-0103")
    J.srun("Job step aborted: Waiting up to 32 seconds for job step to finish.")
    cascade(J, list(range(8)), fail + 5 * S, "remote")
    J.nlog("n-0101", "journal")
    J.nlog("n-0102", "journal")
    return J.spec(
        "node-fail-idle-not-responding",
        "node_failure",
        ["n-0103"],
        "'srun: error: Node failure on n-0103' while Slurm shows n-0103 IDLE* (not "
        "responding) once the job ended; its healthy peers only print remote-exit.",
        state="NODE_FAIL",
        exit_code="0:0",
        reason="NodeDown",
        end=fail + 40 * S,
        node_states={"n-0103": "IDLE*", "n-0101": "IDLE", "n-0102": "IDLE"},
        sections="§2.12, §2.13",
        tags=["map", "srun-l"],
    )


# =========================================================================================
# hang
# =========================================================================================
def h_all_timeouts(seed: int) -> Spec:
    nodes = ["gpu51", "gpu52", "gpu53", "gpu54"]
    J = Job(
        seed, cluster="atlas", job_id="1270001", nodes=nodes, start=t("2026-06-01 01:00:00"), gpn=4
    )
    J.setup("/lustre/ckpt/dit-3b/", 4000, 20000)
    now = J.megatron(J.start + 60 * S, 4000, 20000, 30, 20.0)
    stall = now
    cascade(J, list(range(16)), stall + 600 * S, "timeout", seq=30377)
    srun_tail(J, ("gpu51", [0, 1, 2, 3], "Aborted"), stall + 602 * S, "Aborted", cancel_on="gpu51")
    return J.spec(
        "hang-all-ranks-time-out",
        "hang",
        [],
        "All 16 ranks time out on the same collective (SeqNum=30377) 10 min after the "
        "last progress line; there is no root line anywhere and the srun 'Aborted' "
        "lines are the watchdog's teardown: a hang with no known culprit (§1.1 rule 6).",
        state="FAILED",
        exit_code="0:6",
        reason="NonZeroExitCode",
        end=stall + 610 * S,
        sections="§1.1 rule 6, §2.1",
        tags=["map", "srun-l"],
    )


def h_running_stale(seed: int) -> Spec:
    nodes = ["gpu61", "gpu62"]
    J = Job(seed, cluster="atlas", job_id="1270555", nodes=nodes, start=t("2026-06-03 08:00:00"))
    J.setup("/lustre/ckpt/gpt-1b/", 1000, 50000)
    now = J.megatron(J.start + 60 * S, 1000, 50000, 120, 15.0)
    J.saved(2200, "/lustre/ckpt/gpt-1b/")
    now = J.megatron(now, 2200, 50000, 8, 15.0)
    J.nlog("gpu61", "iso")
    J.nlog("gpu62", "iso")
    return J.spec(
        "hang-running-stale-progress",
        "hang",
        [],
        "The job is still RUNNING but its last progress line (and last_progress_at) is"
        " 47 minutes old with no error anywhere: a silent hang, no culprit.",
        state="RUNNING",
        exit_code="0:0",
        reason="None",
        end=now + 47 * M,
        observed_delay=0,
        sections="§2.14 (progress rule), §1.1 rule 6",
        tags=["map", "srun-l"],
    )


def h_silent_rank(seed: int) -> Spec:
    nodes = ["gpu71", "gpu72", "gpu73", "gpu74"]
    J = Job(
        seed, cluster="atlas", job_id="1271200", nodes=nodes, start=t("2026-06-05 14:00:00"), gpn=4
    )
    J.setup()
    now = J.steps(J.start + 30 * S, 300, 80, 4.0, ranks=list(range(16)))
    stall = now
    cascade(J, others(J, [6]), stall + 600 * S, "timeout", seq=4521)
    srun_tail(
        J,
        ("gpu71", [0, 1, 2, 3], "Aborted (core dumped)"),
        stall + 602 * S,
        "Aborted (core dumped)",
        cancel_on="gpu71",
    )
    return J.spec(
        "hang-silent-rank-sigstop",
        "hang",
        ["gpu72"],
        "15 of 16 ranks time out waiting in collective SeqNum=4521; rank 6 alone "
        "prints nothing (stopped), and the ranks map puts rank 6 on gpu72, the "
        "straggler everyone waited for.",
        state="FAILED",
        exit_code="0:6",
        reason="NonZeroExitCode",
        end=stall + 610 * S,
        sections="§2.1, §1.2 (srun -l + ranks)",
        tags=["cascade", "map", "srun-l"],
        job_only=True,
    )


def h_watchdog_stuck(seed: int) -> Spec:
    nodes = ["node061", "node062", "node063"]
    J = Job(
        seed, cluster="polaris", job_id="340012", nodes=nodes, start=t("2026-03-05 03:00:00"), gpn=4
    )
    J.setup()
    now = J.steps(J.start + 30 * S, 1, 100, 3.0, ranks=[0])
    stall = now
    J.c10(
        6,
        stall + 480 * S,
        "E",
        1484,
        "ProcessGroupNCCL's watchdog got stuck for 480 seconds "
        "without making progress in monitoring enqueued collectives. This typically indicates "
        "a NCCL/CUDA API (e.g., CudaEventDestroy) hang blocking the watchdog, and could be "
        "triggered by another thread holding the GIL inside a CUDA api (for example, "
        "CudaEventDestroy), or other deadlock-prone behaviors.",
        pg=True,
    )
    cascade(J, others(J, [6]), stall + 600 * S, "timeout", seq=1901)
    srun_tail(
        J,
        ("node061", [0, 1, 2, 3], "Aborted (core dumped)"),
        stall + 602 * S,
        "Aborted (core dumped)",
        cancel_on="node061",
    )
    J.nlog("node062", "iso")
    return J.spec(
        "hang-watchdog-stuck-one-rank",
        "hang",
        ["node062"],
        "Rank 6 (node062 by the ranks map) reports its watchdog stuck for 480 s — its "
        "CUDA/NCCL call itself hung — before the other ranks' timeouts; no hardware "
        "line on node062, so a hang with node062 as the stuck node.",
        state="FAILED",
        exit_code="0:6",
        reason="NonZeroExitCode",
        end=stall + 610 * S,
        sections="§2.1 (watchdog got stuck)",
        tags=["cascade", "map", "srun-l"],
        job_only=True,
    )


def h_timeout_pitfall16(seed: int) -> Spec:
    nodes = ["gpu81", "gpu82"]
    J = Job(seed, cluster="atlas", job_id="1272020", nodes=nodes, start=t("2026-06-07 00:00:00"))
    J.setup("/lustre/ckpt/t5-xl/", 10000, 40000)
    now = J.megatron(J.start + 60 * S, 10000, 40000, 60, 20.0)
    end = J.start + 8 * 60 * M
    J.stepd(f"JOB {J.job_id} ON gpu81 CANCELLED AT {iso(end)} DUE TO TIME LIMIT")
    _ = now
    return J.spec(
        "hang-ended-in-timeout",
        "hang",
        [],
        "State TIMEOUT, but the last progress line is over 7 h before the time-limit "
        "line and nothing failed in between: the job hung long before the wall clock "
        "ran out (pitfall 16), culprit unknown.",
        state="TIMEOUT",
        exit_code="0:0",
        reason="TimeLimit",
        end=end,
        sections="§2.12 (TIME LIMIT), §2.13, §3.16",
        tags=["map", "srun-l"],
    )


def h_nvrx_heartbeat(seed: int) -> Spec:
    nodes = ["gpu91", "gpu92"]
    J = Job(
        seed,
        cluster="atlas",
        job_id="1272777",
        nodes=nodes,
        start=t("2026-06-09 10:00:00"),
        gpn=4,
        rank_prefix=False,
    )
    J.setup()
    now = J.steps(J.start + 30 * S, 1, 100, 3.0, ranks=[0])
    for r in range(8):
        J.raw(f"{J.label(r)}[Cycle 0] Did not get subsequent heartbeat. Waited 600.00 seconds.")
    J.srun("error: gpu91: tasks 0-3: Killed")
    J.srun("error: gpu92: tasks 4-7: Killed")
    return J.spec(
        "hang-nvrx-heartbeat-all-ranks",
        "hang",
        [],
        "The NVRx rank monitors report 'Did not get subsequent heartbeat' on every "
        "rank, 10 min after the last step, and then SIGKILL them (the srun Killed "
        "lines are thus confirmed); all ranks stopped together, no culprit.",
        state="FAILED",
        exit_code="0:9",
        reason="NonZeroExitCode",
        end=now + 620 * S,
        sections="§2.14 (NVRx hang monitor), §3.12",
        tags=["map", "srun-l"],
    )


# =========================================================================================
# application
# =========================================================================================
def _app_job(seed: int, job_id: str, nodes: list[str], start: str, **kw) -> Job:
    kw.setdefault("cluster", "atlas")
    J = Job(seed, job_id=job_id, nodes=nodes, start=t(start), **kw)
    J.setup()
    return J


def a_keyerror_hedged(seed: int) -> Spec:
    nodes = ["gpu01", "gpu02", "gpu03", "gpu04"]
    J = _app_job(seed, "1280001", nodes, "2026-07-01 06:00:00")
    now = J.steps(J.start + 30 * S, 1, 60, 5.0, ranks=[0])
    fail = now + 2 * S
    J.traceback(
        21,
        J.train_frames(
            [
                ("/workspace/llm/pretrain_gpt.py", 270, "train", "batch = next(it)"),
                ("/workspace/llm/data/indexed.py", 144, "__getitem__", "doc = self.index[key]"),
            ]
        ),
        ["KeyError: 'shard-00412/doc-77120'"],
    )
    cascade(J, others(J, [21]), fail + 3 * S, "dist")
    srun_tail(
        J,
        ("gpu03", [21], "Exited with exit code 1"),
        fail + 6 * S,
        "Exited with exit code 1",
        cancel_on="gpu01",
    )
    return J.spec(
        "app-keyerror-hedged-network-text",
        "application",
        [],
        "Rank 21 raises KeyError in the data loader first; the 31 DistBackendErrors "
        "that follow explain themselves 'possibly due to a network error', which is "
        "hedged context, not evidence (§3.11); 'ON gpu01' is the reporter.",
        state="FAILED",
        exit_code="1:0",
        reason="NonZeroExitCode",
        end=fail + 8 * S,
        sections="§1.1 rule 3, §2.1, §3.4, §3.11",
        tags=["cascade", "map", "srun-l", "red-herring"],
    )


def a_oom_new(seed: int) -> Spec:
    nodes = ["gpu05", "gpu06"]
    J = _app_job(seed, "1280200", nodes, "2026-07-02 09:30:00")
    now = J.steps(J.start + 30 * S, 1, 20, 8.0, ranks=[0, 8])
    fail = now + 1 * S
    J.traceback(
        5,
        J.train_frames(
            [
                ("/workspace/llm/pretrain_gpt.py", 297, "train", "loss = model(batch).loss"),
                (
                    f"{TORCH}/nn/modules/module.py",
                    1751,
                    "_call_impl",
                    "return forward_call(*args, **kwargs)",
                ),
            ]
        ),
        [
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 3.50 GiB. GPU 5 has a "
            "total capacity of 79.19 GiB of which 1.21 GiB is free. Including non-PyTorch memory, "
            "this process has 77.97 GiB memory in use. Of the allocated memory 74.02 GiB is "
            "allocated by PyTorch, and 2.11 GiB is reserved by PyTorch but unallocated. If reserved"
            " but unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF="
            "expandable_segments:True to avoid fragmentation.  See documentation for Memory "
            "Management  (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)"
        ],
    )
    cascade(J, others(J, [5]), fail + 600 * S, "timeout", seq=41)
    srun_tail(
        J,
        ("gpu05", [5], "Exited with exit code 1"),
        fail + 602 * S,
        "Aborted (core dumped)",
        cancel_on="gpu05",
    )
    return J.spec(
        "app-cuda-oom-torch-outofmemoryerror",
        "application",
        [],
        "Rank 5 raises torch.OutOfMemoryError (CUDA out of memory) at step 21; the "
        "other 15 ranks' watchdog timeouts ten minutes later are cascade.",
        state="FAILED",
        exit_code="1:0",
        reason="NonZeroExitCode",
        end=fail + 610 * S,
        sections="§2.4, §1.1",
        tags=["cascade", "map", "srun-l"],
    )


def a_oom_old_fqdn(seed: int) -> Spec:
    nodes = ["gpu03", "gpu04"]
    J = _app_job(
        seed,
        "1280333",
        nodes,
        "2026-07-03 12:00:00",
        layout="torchrun",
        srun_l=False,
        pt="old",
        nccl="2.18.3",
        fqdn="cluster.example.com",
        script="train.py",
    )
    now = J.steps(J.start + 30 * S, 1, 10, 9.0, ranks=[0])
    fail = now + 1 * S
    J.traceback(
        10,
        J.train_frames([("/workspace/llm/train.py", 180, "train", "out = model(x)")]),
        [
            "RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB (GPU 2; 39.39 GiB "
            "total capacity; 36.12 GiB already allocated; 1.02 GiB free; 37.50 GiB reserved "
            "in total by PyTorch)"
        ],
    )
    cascade(J, others(J, [10]), fail + 4 * S, "remote")
    J.child_failed(
        "gpu04",
        [
            (
                10,
                1,
                fail,
                "To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html",
            )
        ],
        rule=55,
    )
    J.child_failed(
        "gpu03", [(0, -6, fail + 5 * S, f"Signal 6 (SIGABRT) received by PID {J.pid[0]}")], rule=55
    )
    return J.spec(
        "app-cuda-oom-old-runtimeerror-fqdn",
        "application",
        [],
        "Rank 10 raises the older 'RuntimeError: CUDA out of memory'; torchrun's root "
        "cause block on gpu04.cluster.example.com names that rank with exit code 1, "
        "the rest is teardown.",
        state="FAILED",
        exit_code="1:0",
        reason="NonZeroExitCode",
        end=fail + 7 * S,
        sections="§2.4 (older form), §2.5, §3.15, §3.21",
        tags=["cascade", "map", "fqdn"],
    )


def a_nan_loss(seed: int) -> Spec:
    nodes = ["gpu07", "gpu08"]
    J = _app_job(seed, "1280444", nodes, "2026-07-04 02:00:00", gpn=2)
    now = J.steps(J.start + 30 * S, 800, 20, 6.0, ranks=[0, 1, 2, 3], nan_from=812)
    fail = now
    for r in range(4):
        J.traceback(
            r,
            J.train_frames(
                [
                    (
                        "/workspace/llm/pretrain_gpt.py",
                        305,
                        "train",
                        "raise FloatingPointError(f'loss is {loss} at step {step}')",
                    )
                ]
            ),
            ["FloatingPointError: loss is nan at step 819"],
        )
    J.srun("error: gpu07: tasks 0-1: Exited with exit code 1")
    J.srun("error: gpu08: tasks 2-3: Exited with exit code 1")
    return J.spec(
        "app-nan-loss",
        "application",
        [],
        "Loss turns nan at step 812 on every rank and the script stops itself with "
        "FloatingPointError: a numerical (NaN) failure of the training, not a node.",
        state="FAILED",
        exit_code="1:0",
        reason="NonZeroExitCode",
        end=fail + 3 * S,
        sections="§4 (numerical = application)",
        tags=["map", "srun-l"],
    )


def a_nvrx_inf(seed: int) -> Spec:
    nodes = [f"hgx-c{i:02d}" for i in (11, 12)]
    J = _app_job(seed, "5520301", nodes, "2026-05-08 09:00:00", cluster="vega")
    now = J.megatron(J.start + 60 * S, 30000, 60000, 20, 25.0)
    J.raw(f"{J.label(15)}Unexpected result inf (message='found Inf in local grad norm')")
    J.traceback(
        15,
        J.train_frames(
            [
                (
                    "/workspace/megatron/training.py",
                    811,
                    "train_step",
                    "rerun_state_machine.validate_result(grad_norm)",
                )
            ]
        ),
        ["RuntimeError: Unexpected result inf (message='found Inf in local grad norm')"],
    )
    cascade(J, others(J, [15]), now + 600 * S, "timeout", seq=60221)
    srun_tail(
        J,
        ("hgx-c12", [15], "Exited with exit code 1"),
        now + 602 * S,
        "Aborted (core dumped)",
        cancel_on="hgx-c11",
    )
    return J.spec(
        "app-non-finite-grad-norm",
        "application",
        [],
        "Rank 15 reports 'Unexpected result inf (message='found Inf in local grad "
        "norm')' and raises it; the other 15 ranks' timeouts are cascade.",
        state="FAILED",
        exit_code="1:0",
        reason="NonZeroExitCode",
        end=now + 610 * S,
        sections="§2.14 (non-finite), §1.1",
        tags=["cascade", "map", "srun-l"],
    )


def a_xid13_31(seed: int) -> Spec:
    nodes = ["gpu15", "gpu16", "gpu17"]
    J = _app_job(seed, "1280555", nodes, "2026-07-05 16:00:00", gpn=4, pt="old", nccl="2.19.3")
    now = J.steps(J.start + 30 * S, 1, 50, 4.0, ranks=[0])
    fail = now + 1 * S
    J.nlog("gpu15", "iso").kern(fail, xid("0000:b5:00", 13, pid="unknown"))
    J.nlog("gpu17", "iso").kern(fail + 1 * S, xid("0000:2b:00", 31, pid=1942, name="python3"))
    J.nlog("gpu16", "iso")
    J.cuda_error(2, "an illegal memory access was encountered")
    J.cuda_error(9, "an illegal memory access was encountered")
    cascade(J, others(J, [2, 9]), fail + 3 * S, "remote")
    srun_tail(
        J,
        ("gpu15", [2], "Exited with exit code 1"),
        fail + 6 * S,
        "Exited with exit code 1",
        cancel_on="gpu15",
    )
    return J.spec(
        "app-xid13-xid31-different-gpus",
        "application",
        [],
        "Xid 13 on gpu15 and Xid 31 on gpu17 are on different GPUs at the same moment "
        "as two ranks' illegal memory access: the same kernel bug on two GPUs is an "
        "application fault (§3.9), no node is blamed.",
        state="FAILED",
        exit_code="1:0",
        reason="NonZeroExitCode",
        end=fail + 8 * S,
        sections="§2.3, §2.8 (Xid 13, 31), §3.9",
        tags=["cascade", "map", "srun-l"],
    )


def a_xid43_13_assert(seed: int) -> Spec:
    nodes = ["dgx21", "dgx22"]
    J = _app_job(
        seed,
        "9920100",
        nodes,
        "2026-06-22 11:00:00",
        cluster="titan",
        layout="torchrun",
        ranks_map=False,
    )
    now = J.steps(J.start + 30 * S, 1, 30, 4.0, ranks=[0])
    fail = now + 1 * S
    J.nlog("dgx21", "journal").kern(fail, xid("0000:01:00", 43))
    J.nlog("dgx22", "journal").kern(
        fail,
        xid(
            "0002:00:00",
            13,
            "Graphics Exception: ChID 000c, Class 0000cbc0, Offset 00000000, Data 00000000",
            pid=2519562,
            name="python3",
        ),
    )
    J.cuda_error(0, "device-side assert triggered")
    J.cuda_error(11, "device-side assert triggered")
    J.srun("error: dgx21: task 0: Exited with exit code 1")
    J.srun("error: dgx22: task 1: Exited with exit code 1")
    return J.spec(
        "app-device-assert-xid43-xid13",
        "application",
        [],
        "Both nodes' ranks hit 'CUDA error: device-side assert triggered'; the Xid 43 "
        "on dgx21 and Xid 13 on dgx22 are the driver's side effects on two different "
        "GPUs (RESTART_APP/IGNORE, §3.9).",
        state="FAILED",
        exit_code="1:0",
        reason="NonZeroExitCode",
        end=fail + 5 * S,
        sections="§2.3, §2.8 (Xid 13, 43), §3.9",
        tags=["nomap", "srun-l"],
    )


def a_cgroup_2205(seed: int) -> Spec:
    nodes = ["gpu25", "gpu26"]
    J = _app_job(seed, "1280666", nodes, "2026-07-06 07:00:00", gpn=4)
    now = J.steps(J.start + 30 * S, 1, 40, 6.0, ranks=[0])
    fail = now + 1 * S
    J.nlog("gpu25", "bsd").kern(
        fail,
        "Memory cgroup out of memory: Killed process 41237 (python)"
        " total-vm:98765432kB, anon-rss:65432100kB, file-rss:0kB, "
        "shmem-rss:2048kB, UID:10423 pgtables:131072kB oom_score_adj:0",
    )
    J.raw(
        f"slurmstepd: error: Detected 1 oom-kill event(s) in StepId={J.job_id}.0. Some of your "
        "processes may have been killed by the cgroup out-of-memory handler."
    )
    J.srun("error: gpu25: task 3: Out Of Memory")
    cascade(J, others(J, [3]), fail + 600 * S, "timeout", seq=510)
    J.srun("error: gpu25: tasks 0-2: Aborted (core dumped)")
    J.srun("error: gpu26: tasks 4-7: Aborted (core dumped)")
    return J.spec(
        "app-cgroup-oom-slurm-2205",
        "application",
        [],
        "Slurm 22.05's 'Detected 1 oom-kill event(s) ...' and 'srun: error: gpu25: task "
        "3: Out Of Memory', confirmed by the cgroup OOM killer in gpu25's kernel log: "
        "host memory, the job's own fault.",
        state="OUT_OF_MEMORY",
        exit_code="0:125",
        reason="OutOfMemory",
        end=fail + 605 * S,
        sections="§2.7 (OOM killer), §2.12 (cgroup OOM 22.05, srun OOM), §3.1",
        tags=["cascade", "map", "srun-l"],
    )


def a_cgroup_2302(seed: int) -> Spec:
    nodes = ["cn-201", "cn-202", "cn-203"]
    J = _app_job(
        seed, "66440", nodes, "2026-07-07 13:00:00", cluster="mesa", gpn=4, rank_prefix=False
    )
    now = J.steps(J.start + 30 * S, 1, 60, 4.0, ranks=[0])
    fail = now + 1 * S
    J.raw(
        f"slurmstepd: error: Detected 6 oom_kill events in StepId={J.job_id}.0. Some of the "
        "step tasks have been OOM Killed."
    )
    J.srun("error: cn-202: tasks 4-7: Out Of Memory")
    J.raw(
        f"slurmstepd: error: Detected 1 oom_kill event in StepId={J.job_id}.batch. Some of the "
        "step tasks have been OOM Killed."
    )
    cascade(J, [0, 1, 2, 3, 8, 9, 10, 11], fail + 5 * S, "remote")
    return J.spec(
        "app-cgroup-oom-slurm-2302",
        "application",
        [],
        "Slurm >=23.02 cgroup lines 'Detected 6 oom_kill events ... OOM Killed' (and "
        "the singular form) with 'srun: error: cn-202: tasks 4-7: Out Of Memory': the "
        "job ran out of host memory.",
        state="OUT_OF_MEMORY",
        exit_code="0:125",
        reason="OutOfMemory",
        end=fail + 10 * S,
        sections="§2.12 (cgroup OOM >=23.02, srun OOM), §3.1",
        tags=["map", "srun-l"],
    )


def a_killed_confirmed(seed: int) -> Spec:
    nodes = ["hgx-07", "hgx-08"]
    J = _app_job(
        seed,
        "5520777",
        nodes,
        "2026-05-10 21:00:00",
        cluster="vega",
        layout="torchrun",
        srun_l=False,
        fqdn="vega.cluster.example.com",
        script="sft.py",
    )
    now = J.steps(J.start + 30 * S, 1, 30, 6.0, ranks=[0])
    fail = now + 1 * S
    J.nlog("hgx-08", "iso").kern(
        fail,
        "Out of memory: Killed process 208585 (python3) "
        "total-vm:412345678kB, anon-rss:498765432kB, file-rss:0kB, "
        "shmem-rss:0kB, UID:20111 pgtables:981234kB oom_score_adj:0",
    )
    J.nlog("hgx-07", "iso")
    J.pid[12] = 208585
    cascade(J, others(J, [12]), fail + 3 * S, "remote")
    J.child_failed("hgx-08", [(12, -9, fail, "Signal 9 (SIGKILL) received by PID 208585")])
    J.child_failed(
        "hgx-07", [(0, -6, fail + 4 * S, f"Signal 6 (SIGABRT) received by PID {J.pid[0]}")]
    )
    return J.spec(
        "app-sigkill-confirmed-kernel-oom",
        "application",
        [],
        "torchrun's root cause is rank 12 'exitcode -9 (pid 208585)', and hgx-08's "
        "kernel log confirms the OOM killer killed that very pid: host memory "
        "exhaustion by the job (§3.12 confirmation).",
        state="FAILED",
        exit_code="1:0",
        reason="NonZeroExitCode",
        end=fail + 6 * S,
        sections="§2.5 (exitcode -9), §2.7 (OOM killer), §3.12",
        tags=["cascade", "map", "fqdn"],
    )


def a_segfault(seed: int) -> Spec:
    nodes = ["gpu33", "gpu34"]
    J = _app_job(seed, "1280888", nodes, "2026-07-08 17:00:00", gpn=4, rank_prefix=False)
    now = J.steps(J.start + 30 * S, 1, 30, 3.0, ranks=[0])
    fail = now + 1 * S
    J.nlog("gpu34", "iso").kern(
        fail,
        "python[40342]: segfault at 0 ip 00007f3a1b2c45d1 sp "
        "00007ffc5b1be400 error 4 in libcustom_ops.so[7f3a1b200000+"
        "1c5000]",
        level=6,
    )
    J.raw(f"{J.label(5)}Fatal Python error: Segmentation fault")
    J.srun("error: gpu34: task 5: Segmentation fault (core dumped)")
    cascade(J, others(J, [5]), fail + 3 * S, "remote")
    return J.spec(
        "app-segfault-custom-op",
        "application",
        [],
        "'srun: error: gpu34: task 5: Segmentation fault (core dumped)' with the "
        "kernel's segfault record in libcustom_ops.so: a crash in the job's code.",
        state="FAILED",
        exit_code="0:11",
        reason="NonZeroExitCode",
        end=fail + 6 * S,
        sections="§2.7 (segfault), §2.12 (srun signal)",
        tags=["map", "srun-l"],
    )


def a_eaddrinuse(seed: int) -> Spec:
    nodes = ["gpu35", "gpu36"]
    J = Job(
        seed,
        cluster="atlas",
        job_id="1280999",
        nodes=nodes,
        layout="torchrun",
        start=t("2026-07-09 08:00:00"),
        ranks_map=False,
    )
    J.traceback(
        0,
        [(f"{TORCH}/distributed/rendezvous.py", 189, "_create_c10d_store", "return TCPStore(")],
        [
            "torch.distributed.DistNetworkError: The server socket has failed to listen on "
            "any local network address. port: 29500, useIpv6: false, code: -98, name: "
            "EADDRINUSE, message: address already in use"
        ],
    )
    J.srun("error: gpu35: task 0: Exited with exit code 1")
    J.srun("error: gpu36: task 1: Exited with exit code 1")
    return J.spec(
        "infra-store-port-in-use-at-launch",
        "infrastructure",
        [],
        "At launch the store fails with EADDRINUSE on port 29500: another process on the node "
        "(a previous attempt's or another job's) holds the rendezvous port. Not the job's code "
        "and no node fault: restart (issue 35; relabelled from application/hold).",
        state="FAILED",
        exit_code="1:0",
        reason="NonZeroExitCode",
        end=J.start + 10 * S,
        sections="§2.6 (EADDRINUSE)",
        tags=["nomap", "srun-l"],
    )


def a_nccl_invalid_usage(seed: int) -> Spec:
    nodes = ["gpu37", "gpu38"]
    J = _app_job(seed, "1281100", nodes, "2026-07-10 10:00:00", nccl_debug="WARN", nccl="2.21.5")
    now = J.steps(J.start + 20 * S, 1, 3, 4.0, ranks=[0])
    for r in (4, 12):
        J.dist_backend(
            r,
            "invalid usage (run with NCCL_DEBUG=WARN for details)",
            "ncclInvalidUsage: This usually reflects invalid usage of NCCL library.",
        )
    cascade(J, others(J, [4, 12]), now + 600 * S, "timeout", seq=7)
    srun_tail(
        J,
        ("gpu37", [4], "Exited with exit code 1"),
        now + 602 * S,
        "Aborted (core dumped)",
        cancel_on="gpu37",
    )
    return J.spec(
        "app-nccl-invalid-usage",
        "application",
        [],
        "Ranks 4 and 12 fail with 'NCCL error ... invalid usage' / ncclInvalidUsage "
        "(mismatched collective in the job's code); the rest time out as cascade.",
        state="FAILED",
        exit_code="1:0",
        reason="NonZeroExitCode",
        end=now + 610 * S,
        sections="§2.1 (DistBackendError), §2.2 (invalid usage)",
        tags=["cascade", "map", "srun-l"],
    )


def a_no_kernel_image(seed: int) -> Spec:
    nodes = ["gpu39", "gpu40"]
    J = _app_job(seed, "1281200", nodes, "2026-07-11 10:00:00", gpn=2, pt="old")
    for r in range(4):
        J.cuda_error(r, "no kernel image is available for execution on the device")
    J.srun("error: gpu39: tasks 0-1: Exited with exit code 1")
    J.srun("error: gpu40: tasks 2-3: Exited with exit code 1")
    return J.spec(
        "app-no-kernel-image",
        "application",
        [],
        "Every rank fails at start with 'CUDA error: no kernel image is available for "
        "execution on the device': the build does not target this GPU (§2.3).",
        state="FAILED",
        exit_code="1:0",
        reason="NonZeroExitCode",
        end=J.start + 30 * S,
        sections="§2.3",
        tags=["map", "srun-l"],
    )


def a_stream_capture(seed: int) -> Spec:
    nodes = ["hgx-c21", "hgx-c22"]
    J = _app_job(seed, "5521010", nodes, "2026-05-12 14:00:00", cluster="vega", gpn=4)
    now = J.steps(J.start + 20 * S, 1, 5, 5.0, ranks=[0])
    J.cuda_error(3, "operation not permitted when stream is capturing")
    cascade(J, others(J, [3]), now + 600 * S, "timeout", seq=12)
    srun_tail(
        J,
        ("hgx-c21", [3], "Exited with exit code 1"),
        now + 602 * S,
        "Aborted (core dumped)",
        cancel_on="hgx-c21",
    )
    return J.spec(
        "app-stream-capture-error",
        "application",
        [],
        "Rank 3 raises 'torch.AcceleratorError: CUDA error: operation not permitted "
        "when stream is capturing' (CUDA graph misuse in the job); the rest is "
        "cascade.",
        state="FAILED",
        exit_code="1:0",
        reason="NonZeroExitCode",
        end=now + 610 * S,
        sections="§2.3, §3.15",
        tags=["cascade", "map", "srun-l"],
    )


def a_old_xid_week_before(seed: int) -> Spec:
    nodes = ["gpu01", "gpu05", "gpu09"]
    J = _app_job(seed, "1281300", nodes, "2026-07-12 10:00:00", gpn=4)
    now = J.steps(J.start + 30 * S, 1, 80, 4.0, ranks=[0])
    fail = now + 1 * S
    J.nlog("gpu05", "iso").kern(
        J.start - 7 * 24 * 60 * M - 3 * 60 * M, xid("0000:3a:00", 79, pid=None)
    )
    J.nlog("gpu01", "iso")
    J.traceback(
        6,
        J.train_frames(
            [
                (
                    "/workspace/llm/pretrain_gpt.py",
                    340,
                    "evaluate",
                    "score = metrics[cfg.eval.metric](pred, ref)",
                )
            ]
        ),
        ["ValueError: Unknown metric 'rouge-lsum'; expected one of: bleu, rouge-l"],
    )
    cascade(J, others(J, [6]), fail + 600 * S, "timeout", seq=804)
    srun_tail(
        J,
        ("gpu05", [6], "Exited with exit code 1"),
        fail + 602 * S,
        "Aborted (core dumped)",
        cancel_on="gpu01",
    )
    return J.spec(
        "app-valueerror-old-xid79-week-before",
        "application",
        [],
        "Rank 6 (gpu05) raises ValueError in its eval code; gpu05's Xid 79 is from a "
        "week before the job started, far outside the 10-min window (§1.1 rule 5), so "
        "it explains nothing.",
        state="FAILED",
        exit_code="1:0",
        reason="NonZeroExitCode",
        end=fail + 610 * S,
        sections="§1.1 rule 5, §2.8",
        tags=["cascade", "map", "srun-l", "red-herring"],
    )


def a_illegal_xid63(seed: int) -> Spec:
    nodes = ["node071", "node072"]
    J = _app_job(
        seed,
        "341900",
        nodes,
        "2026-03-10 10:00:00",
        cluster="polaris",
        gpn=4,
        nccl_debug="WARN",
        nccl="2.26.2",
    )
    now = J.steps(J.start + 30 * S, 1, 60, 4.0, ranks=[0])
    fail = now + 1 * S
    J.nlog("node072", "caller").kern(fail - 20 * M, xid("0000:10:1c", 63, pid=1896, name="python3"))
    J.cuda_error(6, "an illegal memory access was encountered")
    J.nccl_warn(
        6, fail, "enqueue.cc:1556", "Cuda failure 'an illegal memory access was encountered'"
    )
    cascade(J, others(J, [6]), fail + 600 * S, "timeout", seq=3111)
    srun_tail(
        J,
        ("node072", [6], "Exited with exit code 1"),
        fail + 602 * S,
        "Aborted (core dumped)",
        cancel_on="node071",
    )
    return J.spec(
        "app-illegal-access-with-xid63",
        "application",
        [],
        "Rank 6 hits 'an illegal memory access' (application unless a hardware Xid "
        "coincides); node072's only Xid is 63, informational (§3.8), so nothing "
        "points at the node.",
        state="FAILED",
        exit_code="1:0",
        reason="NonZeroExitCode",
        end=fail + 610 * S,
        sections="§2.2 (Cuda failure), §2.3, §3.8",
        tags=["cascade", "map", "red-herring"],
    )


def a_megatron_assert_cancel(seed: int) -> Spec:
    nodes = ["gpu01", "gpu02", "gpu03"]
    J = _app_job(
        seed, "1281400", nodes, "2026-07-13 04:00:00", gpn=8, layout="torchrun", ranks_map=False
    )
    now = J.megatron(J.start + 60 * S, 0, 20000, 3, 20.0)
    J.traceback(
        17,
        J.train_frames(
            [
                (
                    "/workspace/megatron/core/parallel_state.py",
                    512,
                    "initialize_model_parallel",
                    "assert world_size % (tp * pp) == 0",
                )
            ]
        ),
        [
            "AssertionError: world size (24) is not divisible by tensor_model_parallel_size"
            " (8) x pipeline_model_parallel_size (2)"
        ],
    )
    J.srun("error: gpu03: task 2: Exited with exit code 1")
    J.stepd(f"STEP {J.job_id}.0 ON gpu01 CANCELLED AT {iso(now + 5 * S)}", label="0: ")
    return J.spec(
        "app-assertion-bare-cancel-on-gpu01",
        "application",
        [],
        "srun -l label 2 (third node, gpu03) carries an AssertionError on the parallel"
        " layout; the bare '*** STEP ... ON gpu01 CANCELLED ***' is srun's "
        "kill-on-bad-exit, not a user cancel, and gpu01 is just the reporter (§3.3-4).",
        state="FAILED",
        exit_code="1:0",
        reason="NonZeroExitCode",
        end=now + 6 * S,
        sections="§1.2 (srun -l one task per node), §2.12, §3.3, §3.4",
        tags=["nomap", "srun-l", "red-herring"],
    )


# =========================================================================================
# infrastructure
# =========================================================================================
def i_nccl_internal(seed: int) -> Spec:
    nodes = ["gpu43", "gpu44"]
    J = Job(
        seed,
        cluster="atlas",
        job_id="1290001",
        nodes=nodes,
        start=t("2026-08-01 09:00:00"),
        gpn=4,
        nccl="2.18.1",
        nccl_debug="WARN",
    )
    for r in range(8):
        J.dist_backend(
            r,
            "internal error - please report this issue to the NCCL developers",
            "ncclInternalError: Internal check failed.",
        )
    J.srun("error: gpu43: tasks 0-3: Exited with exit code 1")
    J.srun("error: gpu44: tasks 4-7: Exited with exit code 1")
    return J.spec(
        "infra-nccl-internal-error-at-init",
        "infrastructure",
        [],
        "Every rank on both nodes fails its first collective with 'NCCL error ... "
        "internal error - please report this issue to the NCCL developers': an NCCL "
        "software fault, not a node (§4 'infrastructure software').",
        state="FAILED",
        exit_code="1:0",
        reason="NonZeroExitCode",
        end=J.start + 40 * S,
        sections="§2.1, §2.2 (internal error), §4",
        tags=["map", "srun-l"],
    )


def i_device_busy(seed: int) -> Spec:
    nodes = ["gpu45", "gpu46"]
    J = Job(
        seed,
        cluster="atlas",
        job_id="1290100",
        nodes=nodes,
        start=t("2026-08-02 09:00:00"),
        gpn=4,
        pt="old",
    )
    for r in range(4, 8):
        J.cuda_error(
            r,
            "CUDA-capable device(s) is/are busy or unavailable",
            frames=[
                (
                    "/workspace/llm/pretrain_gpt.py",
                    40,
                    "<module>",
                    "torch.cuda.set_device(local_rank)",
                )
            ],
        )
    J.srun("error: gpu46: tasks 4-7: Exited with exit code 1")
    cascade(J, [0, 1, 2, 3], J.start + 600 * S, "timeout", seq=1, op="BROADCAST")
    J.srun("error: gpu45: tasks 0-3: Aborted (core dumped)")
    return J.spec(
        "infra-cuda-device-busy",
        "infrastructure",
        [],
        "gpu46's ranks get 'CUDA-capable device(s) is/are busy or unavailable' at set-"
        "up: the GPU was held or in the wrong compute mode, an environment fault (§2.3)"
        " that a restart handles.",
        state="FAILED",
        exit_code="1:0",
        reason="NonZeroExitCode",
        end=J.start + 610 * S,
        sections="§2.3",
        tags=["map", "srun-l"],
    )


def i_xid119_fleet(seed: int) -> Spec:
    nodes = [f"gb-{i:03d}" for i in range(1, 9)]
    J = Job(
        seed,
        cluster="nova",
        job_id="20044",
        nodes=nodes,
        layout="torchrun",
        start=t("2026-08-05 06:00:00"),
        gpn=4,
        nccl="2.27.3",
    )
    J.setup()
    now = J.steps(J.start + 30 * S, 1, 40, 5.0, ranks=[0])
    fail = now + 2 * S
    for i, n in enumerate(nodes):
        nl = J.nlog(n, "iso", noise=3)
        nl.kern(
            J.start - 70 * M,
            "NVRM: loading NVIDIA UNIX Open Kernel Module for x86_64  "
            "580.65.06  Release Build  (dvs-builder@U22-I3-AF03-09-1)  Sun Jul 27 06:54:38 "
            "UTC 2025",
            level=6,
        )
        if i in (0, 1, 2, 4, 5, 7):
            nl.kern(
                fail + i * 3 * S,
                xid(
                    f"000{i % 4}:01:00",
                    119,
                    "Timeout waiting for RPC from GSP!",
                    pid=430,
                    name="nv_queue",
                ),
            )
            nl.kern(fail + i * 3 * S, GSP_BANNER)
    cascade(J, list(range(32)), fail + 600 * S, "timeout", seq=2050)
    J.srun("error: gb-[001-008]: tasks 0-7: Exited with exit code 1")
    return J.spec(
        "infra-xid119-fleet-after-driver-update",
        "infrastructure",
        [],
        "Xid 119 (GSP timeout) on 6 of 8 nodes within 20 s, all an hour after the "
        "same new driver was loaded: a driver regression, not six bad GPUs (§3.19).",
        state="FAILED",
        exit_code="1:0",
        reason="NonZeroExitCode",
        end=fail + 610 * S,
        sections="§2.8 (Xid 119), §3.19",
        tags=["cascade", "map", "srun-l"],
    )


def i_checkpoint_io(seed: int) -> Spec:
    nodes = ["gpu47", "gpu48"]
    J = Job(seed, cluster="atlas", job_id="1290200", nodes=nodes, start=t("2026-08-06 00:00:00"))
    J.setup("/lustre/ckpt/gpt-3b/", 5000, 30000)
    now = J.megatron(J.start + 60 * S, 5000, 30000, 50, 15.0)
    J.raw(f"{J.label(0)}saving checkpoint at iteration    5500 to /lustre/ckpt/gpt-3b/")
    J.traceback(
        0,
        [
            (
                f"{TORCH}/distributed/checkpoint/filesystem.py",
                447,
                "write_data",
                "os.fsync(stream.fileno())",
            )
        ],
        ["OSError: [Errno 5] Input/output error"],
    )
    cascade(J, others(J, [0]), now + 600 * S, "timeout", seq=88020)
    J.stepd(
        f"JOB {J.job_id} STEPD TERMINATED ON gpu47 AT {iso(now + 800 * S)} DUE TO JOB NOT "
        "ENDING WITH SIGNALS"
    )
    return J.spec(
        "infra-checkpoint-io-error-lost-mount",
        "infrastructure",
        [],
        "The checkpoint save to /lustre fails with an I/O error on rank 0 and the "
        "step cannot even be killed ('STEPD TERMINATED ... JOB NOT ENDING WITH "
        "SIGNALS', stuck I/O): a storage fault, restart once the mount is back.",
        state="FAILED",
        exit_code="1:0",
        reason="NonZeroExitCode",
        end=now + 800 * S,
        node_states={"gpu47": "DRAINING"},
        sections="§2.12 (STEPD TERMINATED), §2.14 (save started), §4 (storage)",
        tags=["cascade", "map", "srun-l"],
    )


def i_stale_mount(seed: int) -> Spec:
    nodes = ["cn-301", "cn-302", "cn-303"]
    J = Job(
        seed,
        cluster="mesa",
        job_id="66800",
        nodes=nodes,
        start=t("2026-08-07 12:00:00"),
        gpn=4,
        rank_prefix=False,
    )
    J.raw(f"{J.label(J.world - 1)}setting training iterations to 40000")
    for r in range(J.world):
        J.raw(f"{J.label(r)}loading distributed checkpoint from /nfs/ckpt/run3/ at iteration 12000")
    for r in (0, 4, 8):
        J.traceback(
            r,
            [
                (
                    f"{TORCH}/distributed/checkpoint/filesystem.py",
                    661,
                    "read_metadata",
                    "with self.fs.create_stream(path, 'rb') as f:",
                )
            ],
            ["OSError: [Errno 116] Stale file handle: '/nfs/ckpt/run3/.metadata'"],
        )
    J.srun("error: cn-301: tasks 0-3: Exited with exit code 1")
    J.srun("error: cn-302: tasks 4-7: Exited with exit code 1")
    J.srun("error: cn-303: tasks 8-11: Exited with exit code 1")
    return J.spec(
        "infra-stale-nfs-checkpoint-load",
        "infrastructure",
        [],
        "All three nodes fail to read the checkpoint with 'Stale file handle' on "
        "/nfs: the shared filesystem was lost, not the job's code nor one node.",
        state="FAILED",
        exit_code="1:0",
        reason="NonZeroExitCode",
        end=J.start + 60 * S,
        sections="§2.14 (load), §4 (storage)",
        tags=["map", "srun-l"],
    )


# =========================================================================================
# preemption, time_limit, user_cancel
# =========================================================================================
def p_batch(seed: int) -> Spec:
    J = Job(
        seed,
        cluster="atlas",
        job_id="1300001",
        nodes=["gpu61", "gpu62"],
        start=t("2026-08-10 10:00:00"),
    )
    J.setup("/lustre/ckpt/rl-7b/", 100, 5000)
    now = J.megatron(J.start + 60 * S, 100, 5000, 40, 20.0)
    J.stepd(f"JOB {J.job_id} ON gpu61 CANCELLED AT {iso(now + 5 * S)} DUE TO PREEMPTION")
    cascade(J, list(range(16)), now + 6 * S, "remote")
    return J.spec(
        "preempt-job-with-teardown",
        "preemption",
        [],
        "'*** JOB ... CANCELLED AT ... DUE TO PREEMPTION ***' and state PREEMPTED; the "
        "remote-exit lines are the ranks being torn down.",
        state="PREEMPTED",
        exit_code="0:15",
        reason="None",
        end=now + 10 * S,
        default_state="MIXED",
        sections="§2.12 (PREEMPTION), §2.13",
        tags=["map", "srun-l"],
    )


def p_step(seed: int) -> Spec:
    J = Job(
        seed,
        cluster="nova",
        job_id="20101",
        nodes=["gb-010", "gb-011", "gb-012"],
        start=t("2026-08-11 10:00:00"),
        gpn=4,
        layout="torchrun",
        srun_l=False,
    )
    J.setup()
    now = J.steps(J.start + 30 * S, 1, 100, 4.0)
    J.stepd(f"STEP {J.job_id}.0 ON gb-010 CANCELLED AT {iso(now + 3 * S)} DUE TO PREEMPTION")
    J.stepd(f"JOB {J.job_id} ON gb-010 CANCELLED AT {iso(now + 3 * S)} DUE TO PREEMPTION")
    return J.spec(
        "preempt-step-and-job",
        "preemption",
        [],
        "Step and batch script both print 'CANCELLED ... DUE TO PREEMPTION' and sacct "
        "says PREEMPTED: a higher-priority job took the nodes.",
        state="PREEMPTED",
        exit_code="0:15",
        reason="None",
        end=now + 5 * S,
        sections="§2.12, §2.13",
        tags=["map"],
    )


def p_with_noise(seed: int) -> Spec:
    nodes = ["hgx-c31", "hgx-c32"]
    J = Job(seed, cluster="vega", job_id="5530001", nodes=nodes, start=t("2026-05-20 10:00:00"))
    J.setup()
    now = J.steps(J.start + 30 * S, 1, 60, 4.0)
    J.nlog("hgx-c32", "iso").kern(now - 2 * 24 * 60 * M, xid("0000:18:00", 79, pid=None))
    J.stepd(
        f"STEP {J.job_id}.0 ON hgx-c31 CANCELLED AT {iso(now + 3 * S)} DUE TO PREEMPTION",
        label=" 0: ",
    )
    cascade(J, list(range(16)), now + 4 * S, "mixed")
    return J.spec(
        "preempt-with-old-xid-and-teardown",
        "preemption",
        [],
        "'CANCELLED ... DUE TO PREEMPTION' with state PREEMPTED; the teardown errors "
        "follow it, and hgx-c32's Xid 79 is two days old.",
        state="PREEMPTED",
        exit_code="0:15",
        reason="None",
        end=now + 8 * S,
        sections="§2.12, §1.1 rule 5",
        tags=["map", "srun-l", "red-herring"],
    )


def tl_basic(seed: int) -> Spec:
    J = Job(
        seed,
        cluster="atlas",
        job_id="1310001",
        nodes=["gpu63", "gpu64"],
        start=t("2026-08-12 00:00:00"),
    )
    J.setup("/lustre/ckpt/gpt-1b/", 0, 100000)
    now = J.megatron(J.start + 60 * S, 0, 100000, 200, 144.0)
    end = J.start + 8 * 60 * M
    J.stepd(f"JOB {J.job_id} ON gpu63 CANCELLED AT {iso(end)} DUE TO TIME LIMIT")
    _ = now
    return J.spec(
        "time-limit-while-progressing",
        "time_limit",
        [],
        "'*** JOB ... DUE TO TIME LIMIT ***', state TIMEOUT, and progress lines up to "
        "the last minutes: the job simply used its wall time.",
        state="TIMEOUT",
        exit_code="0:0",
        reason="TimeLimit",
        end=end,
        sections="§2.12 (TIME LIMIT), §2.13, §3.16",
        tags=["map", "srun-l"],
    )


def tl_step_abort(seed: int) -> Spec:
    J = Job(
        seed,
        cluster="mesa",
        job_id="67001",
        nodes=["cn-401", "cn-402", "cn-403"],
        start=t("2026-08-13 00:00:00"),
        gpn=4,
        rank_prefix=False,
    )
    J.setup()
    now = J.steps(J.start + 30 * S, 1, 400, 71.5, ranks=[0])
    end = J.start + 8 * 60 * M
    J.stepd(f"STEP {J.job_id}.0 ON cn-401 CANCELLED AT {iso(end)} DUE TO TIME LIMIT")
    J.srun("Job step aborted: Waiting up to 32 seconds for job step to finish.")
    J.stepd(f"JOB {J.job_id} ON cn-401 CANCELLED AT {iso(end)} DUE TO TIME LIMIT")
    J.srun("error: Timed out waiting for job step to complete")
    _ = now
    return J.spec(
        "time-limit-step-aborted",
        "time_limit",
        [],
        "Step and job lines say 'DUE TO TIME LIMIT' with state TIMEOUT; the last step "
        "line is four minutes before the end, so it was still progressing.",
        state="TIMEOUT",
        exit_code="0:0",
        reason="TimeLimit",
        end=end,
        sections="§2.12",
        tags=["map", "srun-l"],
    )


def tl_after_checkpoint(seed: int) -> Spec:
    J = Job(
        seed,
        cluster="polaris",
        job_id="345001",
        nodes=["node081", "node082"],
        start=t("2026-03-20 12:00:00"),
        layout="torchrun",
        srun_l=False,
    )
    J.setup("/gpfs/ckpt/run9/", 20000, 80000)
    now = J.megatron(J.start + 60 * S, 20000, 80000, 150, 95.0)
    J.saved(21500, "/gpfs/ckpt/run9/")
    now = J.megatron(now + 60 * S, 21500, 80000, 38, 95.0)
    end = J.start + 5 * 60 * M
    J.stepd(f"JOB {J.job_id} ON node081 CANCELLED AT {iso(end)} DUE TO TIME LIMIT")
    return J.spec(
        "time-limit-after-checkpoint",
        "time_limit",
        [],
        "TIMEOUT with the TIME LIMIT stepd line; progress and a saved checkpoint "
        "shortly before the end show a healthy job.",
        state="TIMEOUT",
        exit_code="0:0",
        reason="TimeLimit",
        end=end,
        sections="§2.12, §2.14 (checkpoint saved)",
        tags=["map"],
    )


def uc_signal(seed: int) -> Spec:
    J = Job(
        seed,
        cluster="nova",
        job_id="20220",
        nodes=["gb-020", "gb-021"],
        start=t("2026-08-14 10:00:00"),
        gpn=4,
    )
    J.setup()
    now = J.steps(J.start + 30 * S, 1, 50, 4.0)
    J.stepd(f"JOB {J.job_id} ON gb-020 CANCELLED AT {iso(now + 2 * S)} DUE to SIGNAL Terminated")
    return J.spec(
        "user-cancel-signal-slurm25",
        "user_cancel",
        [],
        "Slurm >=25.05 '*** JOB ... CANCELLED AT ... DUE to SIGNAL Terminated ***' "
        "(lowercase 'to') with state CANCELLED: a scancel.",
        state="CANCELLED",
        exit_code="0:15",
        reason="None",
        end=now + 3 * S,
        sections="§2.12 (DUE to SIGNAL), §3.2",
        tags=["map", "srun-l"],
    )


def uc_bare(seed: int) -> Spec:
    J = Job(
        seed,
        cluster="atlas",
        job_id="1320001",
        nodes=["gpu01", "gpu02"],
        start=t("2026-08-15 10:00:00"),
    )
    J.setup()
    now = J.steps(J.start + 30 * S, 1, 50, 4.0)
    J.stepd(f"JOB {J.job_id} ON gpu01 CANCELLED AT {iso(now + 2 * S)}")
    J.srun("Job step aborted: Waiting up to 32 seconds for job step to finish.")
    J.stepd(f"STEP {J.job_id}.0 ON gpu01 CANCELLED AT {iso(now + 2 * S)}")
    return J.spec(
        "user-cancel-bare-line",
        "user_cancel",
        [],
        "The bare '*** JOB ... ON gpu01 CANCELLED AT ... ***' (pre-25.05 scancel) with "
        "no task failure line and sacct state CANCELLED settles it as a user cancel "
        "(§3.3).",
        state="CANCELLED",
        exit_code="0:15",
        reason="None",
        end=now + 3 * S,
        sections="§2.12, §3.3",
        tags=["map", "srun-l"],
    )


def uc_during_errors(seed: int) -> Spec:
    nodes = ["gpu11", "gpu12", "gpu13"]
    J = Job(
        seed, cluster="atlas", job_id="1320100", nodes=nodes, start=t("2026-08-16 10:00:00"), gpn=4
    )
    J.setup()
    now = J.steps(J.start + 30 * S, 1, 50, 4.0)
    J.raw(f"0: slurmstepd: error: *** STEP {J.job_id}.0 CANCELLED AT {iso(now + 2 * S)} ***")
    cascade(J, list(range(12)), now + 3 * S, "remote")
    return J.spec(
        "user-cancel-no-on-node-with-teardown",
        "user_cancel",
        [],
        "'*** STEP ... CANCELLED AT ... ***' without ON <node> (production variant), "
        "sacct CANCELLED, no task failed before it; the remote-exit lines are the "
        "ranks dying after the cancel.",
        state="CANCELLED",
        exit_code="0:15",
        reason="None",
        end=now + 6 * S,
        sections="§2.12 (production variants), §3.3",
        tags=["map", "srun-l"],
    )


# =========================================================================================
# unknown
# =========================================================================================
def u_bare_killed(seed: int) -> Spec:
    J = Job(
        seed,
        cluster="atlas",
        job_id="1330001",
        nodes=["gpu21", "gpu22", "gpu23", "gpu24"],
        start=t("2026-08-17 10:00:00"),
        gpn=2,
        rank_prefix=False,
    )
    J.setup()
    now = J.steps(J.start + 30 * S, 1, 60, 5.0, ranks=[0])
    J.raw(f"{J.label(4)}Killed")
    J.srun("error: gpu23: task 4: Killed")
    cascade(J, others(J, [4]), now + 600 * S, "timeout", seq=61)
    J.srun("error: gpu[21-22,24]: tasks 0-3,5-7: Aborted (core dumped)")
    return J.spec(
        "unknown-bare-killed",
        "unknown",
        [],
        "'srun: error: gpu23: task 4: Killed' and a bare 'Killed' with no OOM record, "
        "cgroup line, monitor or cancel to confirm it (§3.12): cause unknown.",
        state="FAILED",
        exit_code="0:9",
        reason="NonZeroExitCode",
        end=now + 605 * S,
        sections="§1.1 rule 4, §2.7, §3.12",
        tags=["cascade", "map", "srun-l"],
    )


def u_bare_exit(seed: int) -> Spec:
    J = Job(
        seed,
        cluster="mesa",
        job_id="67200",
        nodes=["cn-501", "cn-502"],
        start=t("2026-08-18 10:00:00"),
        gpn=4,
        rank_prefix=False,
    )
    J.setup()
    now = J.steps(J.start + 30 * S, 1, 30, 5.0, ranks=[0])
    J.srun("error: cn-502: task 6: Exited with exit code 3")
    J.srun("error: cn-501: tasks 0-3: Exited with exit code 3")
    J.srun("error: cn-502: tasks 4-5,7: Exited with exit code 3")
    _ = now
    return J.spec(
        "unknown-bare-nonzero-exit",
        "unknown",
        [],
        "Only 'Exited with exit code 3' lines, no traceback, no error text and no "
        "node event: a bare non-zero exit has no known cause (§1.1 rule 6).",
        state="FAILED",
        exit_code="3:0",
        reason="NonZeroExitCode",
        end=now + 5 * S,
        sections="§1.1 rule 6, §2.12",
        tags=["map", "srun-l"],
    )


def u_sigkill_no_confirm(seed: int) -> Spec:
    J = Job(
        seed,
        cluster="vega",
        job_id="5540001",
        nodes=["hgx-11", "hgx-12"],
        start=t("2026-05-25 10:00:00"),
        layout="torchrun",
        srun_l=False,
        fqdn="vega.cluster.example.com",
        script="train.py",
    )
    J.setup()
    now = J.steps(J.start + 30 * S, 1, 30, 5.0, ranks=[0])
    J.nlog("hgx-12", "iso")
    cascade(J, others(J, [9]), now + 5 * S, "remote")
    J.child_failed("hgx-12", [(9, -9, now, f"Signal 9 (SIGKILL) received by PID {J.pid[9]}")])
    J.child_failed(
        "hgx-11", [(0, -6, now + 6 * S, f"Signal 6 (SIGABRT) received by PID {J.pid[0]}")]
    )
    return J.spec(
        "unknown-sigkill-unconfirmed",
        "unknown",
        [],
        "torchrun's root cause is rank 9 'exitcode -9' (SIGKILL) on hgx-12, but no OOM"
        " record, cgroup line, monitor or cancel confirms who killed it (§2.5, §3.12).",
        state="FAILED",
        exit_code="1:0",
        reason="NonZeroExitCode",
        end=now + 8 * S,
        sections="§2.5, §3.12",
        tags=["cascade", "map", "fqdn"],
    )


def u_unspecified_launch(seed: int) -> Spec:
    J = Job(
        seed,
        cluster="polaris",
        job_id="346100",
        nodes=["node091", "node092"],
        start=t("2026-03-25 10:00:00"),
        gpn=4,
    )
    J.setup()
    now = J.steps(J.start + 30 * S, 1, 30, 5.0, ranks=[0])
    J.nlog("node092", "iso")
    J.nlog("node091", "iso")
    J.cuda_error(5, "unspecified launch failure")
    cascade(J, others(J, [5]), now + 3 * S, "remote")
    srun_tail(
        J,
        ("node092", [5], "Exited with exit code 1"),
        now + 5 * S,
        "Aborted (core dumped)",
        cancel_on="node091",
    )
    return J.spec(
        "unknown-unspecified-launch-failure-no-xid",
        "unknown",
        [],
        "Rank 5 reports 'CUDA error: unspecified launch failure', but node092's kernel "
        "log has no hardware Xid, so per §2.3 the cause stays unknown.",
        state="FAILED",
        exit_code="1:0",
        reason="NonZeroExitCode",
        end=now + 7 * S,
        sections="§2.3",
        tags=["cascade", "map", "srun-l"],
    )


SCENARIOS = [
    g_xid79_cascade,
    g_xid48_ecc,
    g_xid95_nomap,
    g_xid74_nvlink,
    g_xid119_single,
    g_xid64_rowremap,
    g_ecc_telemetry_only,
    g_offbus_three_lines,
    g_multi_79_48,
    g_multi_sxid_xid95,
    g_xid94_single,
    g_xid94_repeat,
    g_xid79_red_herrings,
    n_ib_peer_mapped,
    n_ib_peer_corroborated,
    n_ib_reporter_only,
    n_cable_unplugged,
    n_mlx5_fatal,
    n_async_fatal_reporter,
    f_srun_node_failure,
    f_state_only,
    f_hostlist_two,
    f_rank0_store,
    f_idle_star,
    h_all_timeouts,
    h_running_stale,
    h_silent_rank,
    h_watchdog_stuck,
    h_timeout_pitfall16,
    h_nvrx_heartbeat,
    a_keyerror_hedged,
    a_oom_new,
    a_oom_old_fqdn,
    a_nan_loss,
    a_nvrx_inf,
    a_xid13_31,
    a_xid43_13_assert,
    a_cgroup_2205,
    a_cgroup_2302,
    a_killed_confirmed,
    a_segfault,
    a_eaddrinuse,
    a_nccl_invalid_usage,
    a_no_kernel_image,
    a_stream_capture,
    a_old_xid_week_before,
    a_illegal_xid63,
    a_megatron_assert_cancel,
    i_nccl_internal,
    i_device_busy,
    i_xid119_fleet,
    i_checkpoint_io,
    i_stale_mount,
    p_batch,
    p_step,
    p_with_noise,
    tl_basic,
    tl_step_abort,
    tl_after_checkpoint,
    uc_signal,
    uc_bare,
    uc_during_errors,
    u_bare_killed,
    u_bare_exit,
    u_sigkill_no_confirm,
    u_unspecified_launch,
]


def write(spec: Spec, idx: int) -> str:
    name = f"{idx:02d}-{spec.slug}"
    d = HERE / name
    (d / "logs").mkdir(parents=True)
    (d / "job.json").write_text(json.dumps(spec.job, indent=2) + "\n")
    (d / "logs" / "job.log").write_text(spec.log)
    for node, text in spec.node_logs.items():
        (d / "nodes").mkdir(exist_ok=True)
        (d / "nodes" / f"{node}.log").write_text(text)
    if spec.telemetry:
        (d / "telemetry.jsonl").write_text(
            "".join(json.dumps(s, separators=(",", ":")) + "\n" for s in spec.telemetry)
        )
    expected = {
        "category": spec.category,
        "culprit_nodes": spec.culprits,
        "action": spec.action,
        "why": spec.why,
    }
    (d / "expected.json").write_text(json.dumps(expected, indent=2) + "\n")
    return name


BEGIN, END = "<!-- table: written by make_corpus.py -->", "<!-- /table -->"


def main() -> None:
    for old in HERE.iterdir():
        if old.is_dir() and old.name[:2].isdigit() and old.name[2] == "-":
            shutil.rmtree(old)
    rows = []
    for i, fn in enumerate(SCENARIOS, 1):
        spec = fn(1000 + i)
        name = write(spec, i)
        culprits = ", ".join(spec.culprits) or "—"
        rows.append(
            f"| `{name}` | {spec.category} | {culprits} | {spec.action} | {spec.sections} | "
            f"{', '.join(spec.tags)} |"
        )
    table = (
        "| bundle | category | culprits | action | written from (docs/failure-signatures.md) "
        "| features |\n"
        "|---|---|---|---|---|---|\n" + "\n".join(rows) + "\n"
    )
    readme = HERE / "README.md"
    text = readme.read_text()
    a, b = text.index(BEGIN) + len(BEGIN), text.index(END)
    readme.write_text(text[:a] + "\n" + table + text[b:])
    print(f"wrote {len(rows)} bundles")


if __name__ == "__main__":
    main()
