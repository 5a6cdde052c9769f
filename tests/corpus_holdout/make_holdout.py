#!/usr/bin/env python3
"""Write the held-out incident-bundle corpus under tests/corpus_holdout/ (deterministic).

Run from the repository root: ``python tests/corpus_holdout/make_holdout.py``. The scenarios are
different from tests/corpus/ (node names, job sizes, Slurm states, event order, noise, syslog time
zones) and were labelled from docs/failure-signatures.md alone, without looking at the engine.
See README.md.
"""

from __future__ import annotations

import json
import shutil
import sys
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _hold import M, S, klog, others, short_timeout, tasks  # noqa: E402
from _lib import MSG, PCI, TORCH, Job, Spec, iso, t, xid  # noqa: E402

HERE = Path(__file__).resolve().parent
TB_HINT = "To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html"


def srun_rest(J: Job, msg: str, skip_nodes: tuple = (), skip_ranks: tuple = ()) -> None:
    """One srun task-exit line per remaining node (§2.12), in allocation order."""
    for n in J.nodes:
        if n in skip_nodes:
            continue
        if J.layout == "per_gpu":
            ts = [r for r in J.ranks_on(n) if r not in skip_ranks]
        else:
            ts = [J.nodes.index(n)]
        if ts:
            J.srun(f"error: {n}: {tasks(ts)}: {msg}")


def sig(J: Job, r: int, n: int, name: str) -> str:
    return f"Signal {n} ({name}) received by PID {J.pid[r]}"


# =========================================================================================
# gpu_hardware
# =========================================================================================
def g_xid149_nvlink5(seed: int) -> Spec:
    nodes = [f"nvl72-r2-c{i}" for i in range(11, 19)]
    J = Job(
        seed,
        cluster="ridge",
        job_id="4410872",
        nodes=nodes,
        gpn=4,
        start=t("2026-04-03 22:05:10"),
        nccl="2.27.3",
        script="pretrain_moe.py",
    )
    J.setup("/scratch/ckpt/moe-236b/", 31000, 90000)
    now = J.megatron(J.start + 120 * S, 31000, 90000, 25, 42.0)
    fail = now + 20 * S
    bad = "nvl72-r2-c14"
    kl = klog(J, bad, "iso", tz=60)
    kl.kern(
        fail,
        "NVRM: Xid (PCI:0018:01:00): 149, NETIR_LINK_EVT  Fatal   XC0 i0 Link 09 (0x025525c6 "
        "0x00000000 0x00000000 0x00000000 0x00000000 0x00000000)",
    )
    kl.kern(
        fail + 1 * S,
        "NVRM: Xid (PCI:0018:01:00): 154, GPU recovery action changed from 0x0 (None) to 0x2 "
        "(Node Reboot Required)",
    )
    klog(J, "nvl72-r2-c11", "iso", tz=60)
    klog(J, "nvl72-r2-c17", "iso", tz=60)
    J.watchdog_exc(
        13,
        fail + 3 * S,
        "CUDA error: Invalid access of peer GPU memory over nvlink or a hardware error",
    )
    J.srun(f"error: {bad}: task 13: Aborted (core dumped)")
    for i, r in enumerate(others(J, [13])):
        short_timeout(J, r, fail + 601 * S + timedelta(milliseconds=29 * i), 2817344)
    srun_rest(J, "Aborted (core dumped)", skip_ranks=(13,))
    return J.spec(
        "gpu-xid149-nvlink5-fatal-peer-access-cascade",
        "gpu_hardware",
        [bad],
        "nvl72-r2-c14's kernel log has a Fatal Xid 149 (NETIR_LINK_EVT) and Xid 154 'to 0x2 "
        "(Node Reboot Required)', and rank 13 (ranks map: nvl72-r2-c14) dies with 'Invalid "
        "access of peer GPU memory over nvlink or a hardware error' ten minutes before the 31 "
        "watchdog timeouts, which are cascade (§2.8 Xid 149/154, §2.1 peer-memory case, §1.1 "
        "rule 1).",
        state="FAILED",
        exit_code="0:6",
        reason="NonZeroExitCode",
        end=fail + 606 * S,
        sections="§1.1, §1.2, §2.1 (peer-memory case), §2.8 (Xid 149, 154), §3.5 (domain 0018)",
        tags=["cascade", "map", "srun-l", "tz"],
    )


def g_two_nodes_mig48_xid95(seed: int) -> Spec:
    nodes = [f"a100-r3-n{i:02d}" for i in range(1, 9)]
    J = Job(
        seed,
        cluster="fjord",
        job_id="918273",
        nodes=nodes,
        layout="torchrun",
        rank_prefix=False,
        ranks_map=False,
        start=t("2026-02-11 13:20:00"),
        pt="old",
        nccl="2.18.3",
        script="train_t5.py",
    )
    J.setup()
    now = J.steps(J.start + 60 * S, 1, 60, 6.0, ranks=[0])
    fail = now + 2 * S
    a, b = "a100-r3-n07", "a100-r3-n03"
    ra, rb = 53, 18  # local GPU 5 of n07, local GPU 2 of n03
    ka = klog(J, a, "bsd", tz=-300)
    ka.kern(
        fail - 1 * S,
        f"NVRM: Xid (PCI:0000:B7:00 GPU-I:3 GPU-CI:0): 48, pid={J.pid[ra]}, name=python, "
        + MSG[48],
    )
    kb = klog(J, b, "bsd", tz=-300)
    kb.kern(fail + 1 * S, xid("0000:3a:00.0", 95, pid="unknown"))
    # red herrings: an informational Xid 63 and a non-fatal SXid, well before the failure
    klog(J, "a100-r3-n05", "bsd", tz=-300).kern(
        fail - 41 * M,
        "NVRM: Xid (PCI:0000:10:1c): 63, pid=1896, Row Remapper: New row marked for remapping, "
        "reset gpu to activate.",
    )
    klog(J, "a100-r3-n01", "bsd", tz=-300).kern(
        fail - 26 * M,
        "nvidia-nvswitch2: SXid (PCI:0000:86:00.0): 20009, Non-fatal, Link 04 RX Short Error Rate",
        level=4,
    )
    J.cuda_error(ra, "uncorrectable ECC error encountered")
    J.cuda_error(rb, "uncorrectable ECC error encountered")
    for i, r in enumerate(others(J, [ra, rb])):
        J.remote_exit(r, fail + 3 * S + timedelta(milliseconds=41 * i), teardown=False)
    for n in [a, b] + [x for x in nodes if x not in (a, b)]:
        rs = J.ranks_on(n)
        if n == a:
            fails = [(ra, 1, fail, TB_HINT)]
        elif n == b:
            fails = [(rb, 1, fail + 1 * S, TB_HINT)]
        else:
            fails = []
        fails += [(r, -6, fail + 4 * S, sig(J, r, 6, "SIGABRT")) for r in rs if r not in (ra, rb)]
        J.child_failed(n, fails, rule=55)
    J.srun(f"error: {a}: task 6: Exited with exit code 1")
    J.srun(f"error: {b}: task 2: Exited with exit code 1")
    srun_rest(J, "Exited with exit code 1", skip_nodes=(a, b))
    tel = []
    for n in (a, b, "a100-r3-n05"):
        for g in range(8):
            bad = n == a and g == 5
            for k, w in enumerate((fail - 5 * M, fail + 20 * S)):
                tel.append(
                    {
                        "node": n,
                        "gpu": g,
                        "time": iso(w) + "Z",
                        "ecc_dbe_volatile": 2 if bad and k == 1 else 0,
                    }
                )
    return J.spec(
        "gpu-two-nodes-mig-xid48-and-xid95",
        "gpu_hardware",
        [a, b],
        "Two hardware roots within two seconds: a100-r3-n07's kernel log has a MIG-form Xid 48 "
        "(double-bit ECC, and its GPU 5 DBE counter rises) and a100-r3-n03's has Xid 95 "
        "(uncontained), each followed by 'uncorrectable ECC error encountered' on that node's "
        "rank; the Xid 63 and the non-fatal SXid are not causes and the remote-exit lines are "
        "cascade (§2.8 Xid 48/95, §3.6 MIG, §3.8, §2.10, §1.2 kernel log).",
        state="FAILED",
        exit_code="1:0",
        reason="NonZeroExitCode",
        end=fail + 8 * S,
        telemetry=tel,
        sections="§1.2, §2.3, §2.8 (Xid 48, 95, 63), §2.10 (Non-fatal), §3.5, §3.6, §3.8",
        tags=["cascade", "multi", "nomap", "srun-l", "red-herring", "telemetry", "tz"],
    )


# =========================================================================================
# network
# =========================================================================================
def n_ib_fatal_failed_device(seed: int) -> Spec:
    nodes = [f"ib-r07-u{u}" for u in (18, 20, 22, 24, 26, 28)]
    J = Job(
        seed,
        cluster="tundra",
        job_id="6650931",
        nodes=nodes,
        start=t("2026-05-19 06:40:00"),
        nccl="2.26.5",
        nccl_debug="WARN",
        script="pretrain_llama.py",
    )
    J.setup("/gpfs/ckpt/llama-70b/", 15500, 250000)
    now = J.megatron(J.start + 80 * S, 15500, 250000, 30, 28.0)
    fail = now + 15 * S
    bad = "ib-r07-u22"
    klog(J, bad, "iso", tz=330).kern(
        fail - 6 * S,
        "mlx5_core 0000:d2:00.0: poll_health:825: device's health compromised - reached miss "
        "count.",
    )
    klog(J, "ib-r07-u18", "iso", tz=330)
    bad_ranks = J.ranks_on(bad)
    # stdout interleaving: the peers' flush errors and first remote exits reach the file first
    for r in (9, 27, 30, 41):
        J.nccl_warn(
            r,
            fail + 1 * S,
            "transport/net_ib.cc:1696",
            f"NET/IB : Got completion from peer {J.ip[bad]}<{J.rng.randint(40000, 60000)}> with "
            f"error 5, opcode 48, len 32764, vendor err 249",
        )
    for i, r in enumerate([x for x in others(J, bad_ranks)][:12]):
        J.remote_exit(r, fail + 4 * S + timedelta(milliseconds=23 * i), teardown=False)
    for r in bad_ranks[:4]:
        J.nccl_warn(
            r,
            fail,
            "transport/net_ib/p2p_resiliency.cc:388",
            "NET/IB: Fatal error. Detected 1 failed devices out of 4 devices on the default_pg "
            "communicator",
        )
        J.nccl_warn(
            r,
            fail,
            "transport/net_ib/p2p_resiliency.cc:402",
            "NET/IB: The error is fatal (mlx5_2 failed). Cannot continue.",
        )
    for r in bad_ranks:
        J.dist_backend(
            r,
            "unhandled system error (run with NCCL_DEBUG=INFO for details)",
            expl="ncclSystemError: System call (e.g. socket, malloc) or external library call "
            "failed or device error.",
        )
    for i, r in enumerate([x for x in others(J, bad_ranks)][12:]):
        J.remote_exit(r, fail + 5 * S + timedelta(milliseconds=23 * i), teardown=False)
    J.srun(f"error: {bad}: {tasks(bad_ranks)}: Exited with exit code 1")
    srun_rest(J, "Aborted (core dumped)", skip_nodes=(bad,))
    return J.spec(
        "net-ib-fatal-failed-device-mlx5-health",
        "network",
        [bad],
        "ib-r07-u22's kernel log has the fatal mlx5 'device's health compromised - reached miss "
        "count.' and its own ranks' NCCL prefix reports 'NET/IB: Fatal error. Detected 1 failed "
        "devices'; the error-5 (flush) completions and remote-exit lines printed earlier in the "
        "file are cascade (§2.11, §2.2, §1.2 NCCL prefix, §1.1 rule 1).",
        state="FAILED",
        exit_code="1:0",
        reason="NonZeroExitCode",
        end=fail + 9 * S,
        sections="§1.1, §1.2, §2.2 (NET/IB Fatal error, error 5), §2.11 (poll_health)",
        tags=["cascade", "map", "srun-l", "tz", "order"],
    )


def n_ib_retry_every_node(seed: int) -> Spec:
    nodes = [f"hgx-k8-{i:02d}" for i in range(1, 7)]
    J = Job(
        seed,
        cluster="mesa",
        job_id="240117",
        nodes=nodes,
        start=t("2026-03-28 17:10:00"),
        nccl="2.21.5",
        nccl_debug="WARN",
        script="train_gpt.py",
    )
    J.setup()
    now = J.steps(J.start + 40 * S, 1, 140, 2.5, ranks=[0, J.world - 1])
    fail = now + 9 * S
    reporters = []
    for i, n in enumerate(nodes):
        peer = nodes[(i + 1) % len(nodes)]
        for r in J.ranks_on(n)[:2]:
            reporters.append(r)
            J.nccl_warn(
                r,
                fail,
                "transport/net_ib.cc:1696",
                f"NET/IB : Got completion from peer {J.ip[peer]}<{J.rng.randint(40000, 60000)}> "
                f"with error 12, opcode 0, len 0, vendor err 129",
            )
    for r in reporters:
        J.dist_backend(
            r,
            "unhandled system error (run with NCCL_DEBUG=INFO for details)",
            expl="ncclSystemError: System call (e.g. socket, malloc) or external library call "
            "failed or device error.",
        )
    for i, r in enumerate(others(J, reporters)):
        J.remote_exit(r, fail + 2 * S + timedelta(milliseconds=17 * i), teardown=False)
    J.srun(f"error: hgx-k8-[01-06]: {tasks(list(range(J.world)))}: Exited with exit code 1")
    return J.spec(
        "net-ib-retry-exceeded-on-every-node",
        "network",
        [],
        "Every node reports 'Got completion from peer ... with error 12' (retries exhausted) "
        "toward a different peer in the same second, NCCL_DEBUG=WARN printed no INFO line that "
        "maps the peer IPs, and no node has a NIC kernel event: a fabric fault that singles out "
        "no node (§2.2 error 12, §1.2 peer caveat, §3.22).",
        state="FAILED",
        exit_code="1:0",
        reason="NonZeroExitCode",
        end=fail + 6 * S,
        sections="§1.2, §2.2 (error 12), §2.12 (hostlist), §3.22",
        tags=["map", "srun-l", "hostlist"],
    )


# =========================================================================================
# node_failure
# =========================================================================================
def f_sixteen_nodes_torchrun(seed: int) -> Spec:
    nodes = [f"dgx-{i:04d}" for i in range(41, 57)]
    J = Job(
        seed,
        cluster="halo",
        job_id="3307715",
        nodes=nodes,
        layout="torchrun",
        ranks_map=False,
        start=t("2026-06-02 03:00:00"),
        nccl="2.23.4",
        nccl_debug="WARN",
        script="pretrain_gpt.py",
    )
    J.setup("/lustre/ckpt/gpt-175b/", 88000, 300000)
    now = J.megatron(J.start + 150 * S, 88000, 300000, 30, 55.0)
    fail = now + 25 * S
    dead = "dgx-0047"
    klog(J, "dgx-0050", "iso", tz=0).kern(
        fail - 20 * M,
        "NVRM: Xid (PCI:0000:9a:00): 63, pid=311207, Row Remapper: New row marked for remapping, "
        "reset gpu to activate.",
    )
    klog(J, "dgx-0041", "iso", tz=0)
    for r in (3, 77, 101):
        J.nccl_warn(
            r,
            fail + 1 * S,
            "misc/socket.cc:49",
            "socketProgress: Connection closed by remote peer "
            f"{J.ip[dead]}<{J.rng.randint(30000, 60000)}>",
        )
    survivors = [r for r in range(J.world) if J.node(r) != dead]
    for i, r in enumerate(survivors):
        J.remote_exit(r, fail + 2 * S + timedelta(milliseconds=19 * i), teardown=False)
    order = [n for n in nodes if n != dead]
    J.rng.shuffle(order)
    for n in order:
        J.srun(f"error: {n}: task {nodes.index(n)}: Exited with exit code 1")
    J.srun(f"error: Node failure on {dead}")
    J.srun("Job step aborted: Waiting up to 32 seconds for job step to finish.")
    J.stepd(
        f"JOB {J.job_id} ON dgx-0041 CANCELLED AT {iso(fail + 302 * S)} DUE TO NODE FAILURE, "
        "SEE SLURMCTLD LOG FOR DETAILS"
    )
    return J.spec(
        "nodefail-16-nodes-late-srun-line-no-map",
        "node_failure",
        [dead],
        "'srun: error: Node failure on dgx-0047' with dgx-0047 DOWN* and job state NODE_FAIL; the "
        "15 task-exit srun lines printed before it (first: a healthy node) and the 120 "
        "remote-exit lines are cascade, 'ON dgx-0041' is the reporter and dgx-0050's Xid 63 is "
        "informational (§2.12, §2.13, §1.1 rule 1, §3.4, §3.8).",
        state="NODE_FAIL",
        exit_code="0:0",
        reason="NodeFail",
        end=fail + 303 * S,
        node_states={dead: "DOWN*"},
        default_state="IDLE",
        sections="§1.1, §1.2 (Node failure line), §2.2 (socketProgress), §2.12, §2.13, §3.4, §3.8",
        tags=["cascade", "nomap", "srun-l", "red-herring", "order"],
    )


def f_two_nodes_hostlist_gap(seed: int) -> Spec:
    nodes = [f"gpu{i}" for i in range(101, 113)]
    J = Job(
        seed,
        cluster="atoll",
        job_id="55208",
        nodes=nodes,
        gpn=4,
        start=t("2026-01-30 20:45:00"),
        pt="old",
        nccl="2.18.1",
        script="train_bert.py",
    )
    J.setup()
    now = J.steps(J.start + 50 * S, 1, 150, 3.0, ranks=[0])
    fail = now + 4 * S
    dead = ["gpu104", "gpu109"]
    klog(J, "gpu101", "bsd", tz=480)
    survivors = [r for r in range(J.world) if J.node(r) not in dead]
    for i, r in enumerate(survivors):
        w = fail + 3 * S + timedelta(milliseconds=31 * i)
        if i % 3 == 0:
            J.tcpstore(r, w, 0)
        J.remote_exit(r, w + 1 * S, teardown=False)
    J.srun("error: Node failure on gpu[104,109]")
    J.srun("Job step aborted: Waiting up to 32 seconds for job step to finish.")
    J.stepd(
        f"STEP {J.job_id}.0 ON gpu101 CANCELLED AT {iso(fail + 190 * S)} DUE TO NODE FAILURE, "
        "SEE SLURMCTLD LOG FOR DETAILS"
    )
    J.stepd(
        f"JOB {J.job_id} ON gpu101 CANCELLED AT {iso(fail + 190 * S)} DUE TO NODE FAILURE, "
        "SEE SLURMCTLD LOG FOR DETAILS"
    )
    return J.spec(
        "nodefail-two-nodes-noncontiguous-hostlist",
        "node_failure",
        dead,
        "'srun: error: Node failure on gpu[104,109]' names two nodes (hostlist expanded), both "
        "DOWN* in the node states; the TCPStore Broken pipe and remote-exit lines of the 40 "
        "surviving ranks are cascade and 'ON gpu101' is only the reporter (§1.2, §2.12, §3.4, "
        "§3.21).",
        state="NODE_FAIL",
        exit_code="0:0",
        reason="NodeFail",
        end=fail + 191 * S,
        node_states={"gpu104": "DOWN*", "gpu109": "DOWN*"},
        default_state="IDLE",
        sections="§1.2 (hostlist), §2.6 (Broken pipe), §2.12, §2.13, §3.4, §3.21",
        tags=["cascade", "multi", "map", "srun-l", "hostlist"],
    )


# =========================================================================================
# hang
# =========================================================================================
def h_nvrx_one_rank(seed: int) -> Spec:
    nodes = [f"h100-b2-{i:02d}" for i in range(1, 5)]
    J = Job(
        seed,
        cluster="sierra",
        job_id="1029384",
        nodes=nodes,
        start=t("2026-08-14 11:30:00"),
        script="pretrain_mamba.py",
    )
    J.setup("/vast/ckpt/mamba-8b/", 4000, 60000)
    now = J.megatron(J.start + 70 * S, 4000, 60000, 35, 18.0)
    stuck = 22
    bad = J.node(stuck)
    J.raw(f"{J.label(stuck)}[Cycle 1] Did not get subsequent heartbeat. Waited 300.0 seconds.")
    J.srun(f"error: {bad}: task {stuck}: Killed")
    w0 = now + 302 * S
    for i, r in enumerate(others(J, [stuck])):
        J.remote_exit(r, w0 + timedelta(milliseconds=37 * i), teardown=i % 4 == 0)
    srun_rest(J, "Aborted (core dumped)", skip_ranks=(stuck,))
    return J.spec(
        "hang-nvrx-monitor-fires-on-one-rank",
        "hang",
        [bad],
        "Only rank 22's NVRx monitor reports 'Did not get subsequent heartbeat. Waited 300.0 "
        "seconds.' and kills it (so 'task 22: Killed' is confirmed); rank 22 runs on h100-b2-03 "
        "(ranks map) and the other ranks' remote-exit lines come after it (§2.14 NVRx hang "
        "monitor, §3.12, §1.2 srun -l + ranks, §1.1 rule 1).",
        state="FAILED",
        exit_code="0:9",
        reason="NonZeroExitCode",
        end=w0 + 4 * S,
        sections="§1.1, §1.2 (srun -l + ranks), §2.14 (NVRx hang monitor), §3.12",
        tags=["cascade", "map", "srun-l"],
        job_only=True,
    )


def h_all_ranks_hostlist_abort(seed: int) -> Spec:
    nodes = [f"trn-a{i:02d}" for i in range(1, 5)]
    J = Job(
        seed,
        cluster="basin",
        job_id="88123",
        nodes=nodes,
        srun_l=False,
        ranks_map=False,
        start=t("2026-02-27 04:00:00"),
        script="train_dit.py",
    )
    J.setup()
    now = J.steps(J.start + 45 * S, 1, 200, 4.0, ranks=[0])
    w0 = now + 612 * S
    order = list(range(J.world))
    J.rng.shuffle(order)
    for i, r in enumerate(order):
        J.wd_timeout(r, w0 + timedelta(milliseconds=53 * i), 60219, "_ALLGATHER_BASE", 1048576)
    J.srun(f"error: trn-a[01-04]: {tasks(list(range(J.world)))}: Aborted (core dumped)")
    return J.spec(
        "hang-all-ranks-time-out-hostlist-abort",
        "hang",
        [],
        "All 32 ranks print 'Watchdog caught collective operation timeout' for the same "
        "SeqNum=60219 about ten minutes after the last step, with no root line anywhere; the one "
        "srun line covers every node (trn-a[01-04]) so no node is singled out (§1.1 rule 6, "
        "§2.1, §1.2).",
        state="FAILED",
        exit_code="0:6",
        reason="NonZeroExitCode",
        end=w0 + 5 * S,
        sections="§1.1 rule 6, §2.1, §2.12 (hostlist)",
        tags=["nomap", "hostlist"],
    )


# =========================================================================================
# application
# =========================================================================================
def a_shape_mismatch_16node(seed: int) -> Spec:
    nodes = [f"node{i:04d}" for i in range(101, 117)]
    J = Job(
        seed,
        cluster="pampa",
        job_id="702215",
        nodes=nodes,
        gpn=4,
        start=t("2026-07-08 09:00:00"),
        nccl="2.20.5",
        nccl_debug="WARN",
        script="train_llm.py",
    )
    J.setup("/data/ckpt/run7/", 2000, 50000)
    now = J.megatron(J.start + 90 * S, 2000, 50000, 24, 20.0)
    J.nccl_warn(
        13,
        now - 1 * S,
        "transport/net_ib.cc:253",
        "NET/IB : mlx5_1:1 Got non-fatal async event: port error(10)",
    )
    now = J.megatron(now, 2240, 50000, 100, 20.0)
    bad = 37
    fail = now + 6 * S
    J.traceback(
        bad,
        J.train_frames(
            [
                (f"/workspace/llm/{J.script}", 233, "train", "logits = model(tokens, pos)"),
                ("/workspace/llm/model/rope.py", 88, "forward", "q = q * cos + rot(q) * sin"),
            ]
        ),
        [
            "RuntimeError: The size of tensor a (4096) must match the size of tensor b (4097) at "
            "non-singleton dimension 1"
        ],
    )
    J.srun(f"error: {J.node(bad)}: task {bad}: Exited with exit code 1")
    for i, r in enumerate(others(J, [bad])):
        short_timeout(J, r, fail + 600 * S + timedelta(milliseconds=21 * i), 98301)
    srun_rest(J, "Aborted (core dumped)", skip_ranks=(bad,))
    return J.spec(
        "app-tensor-shape-mismatch-16-nodes-cascade",
        "application",
        [],
        "Rank 37 raises 'RuntimeError: The size of tensor a (4096) must match the size of tensor "
        "b (4097)', a code error; the 63 watchdog timeouts ten minutes later are cascade and the "
        "non-fatal IB port error on node0104 came over half an hour earlier and training went on "
        "(§1.1 rules 1-2, §3.17, §4).",
        state="FAILED",
        exit_code="1:0",
        reason="NonZeroExitCode",
        end=fail + 604 * S,
        sections="§1.1, §2.1, §2.2 (non-fatal async event), §3.17, §4 (user error)",
        tags=["cascade", "map", "srun-l", "red-herring"],
    )


def a_cublas_alloc_reverse_dns(seed: int) -> Spec:
    nodes = ["gpu-l40s-01", "gpu-l40s-02"]
    J = Job(
        seed,
        cluster="orca",
        job_id="16602",
        nodes=nodes,
        gpn=4,
        layout="torchrun",
        srun_l=False,
        ranks_map=False,
        start=t("2026-03-03 15:12:00"),
        pt="old",
        nccl="2.19.3",
        script="finetune.py",
        fqdn="ai.corp.example.com",
    )
    J.setup()
    now = J.steps(J.start + 20 * S, 1, 40, 3.0, ranks=[0])
    bad = 6
    J.cuda_error(
        bad,
        "CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`",
        J.train_frames(
            [
                (f"/workspace/llm/{J.script}", 140, "train", "out = head(hidden)"),
                (f"{TORCH}/nn/modules/linear.py", 125, "forward", "return F.linear(x, w, b)"),
            ]
        ),
    )
    for i, r in enumerate(others(J, [bad])):
        J.remote_exit(r, now + 3 * S + timedelta(milliseconds=90 * i))
    rev = J.host
    J.host = lambda node: "1.0.0.127.in-addr.arpa"  # type: ignore[method-assign]
    J.child_failed(
        "gpu-l40s-02",
        [(bad, 1, now + 1 * S, TB_HINT)]
        + [(r, -6, now + 4 * S, sig(J, r, 6, "SIGABRT")) for r in (4, 5, 7)],
        rule=60,
    )
    J.host = rev  # type: ignore[method-assign]
    J.child_failed(
        "gpu-l40s-01",
        [(r, -6, now + 4 * S, sig(J, r, 6, "SIGABRT")) for r in range(4)],
        rule=60,
    )
    J.srun("error: gpu-l40s-02: task 1: Exited with exit code 1")
    J.srun("error: gpu-l40s-01: task 0: Exited with exit code 1")
    return J.spec(
        "app-cublas-alloc-failed-reverse-dns-host",
        "application",
        [],
        "Rank 6 raises 'CUDA error: CUBLAS_STATUS_ALLOC_FAILED', which NVRx files as an "
        "application root (§2.4); the other ranks' SIGABRT exits are cascade, and the torchrun "
        "host '1.0.0.127.in-addr.arpa' names no allocated node anyway (§1.2, §3.21).",
        state="FAILED",
        exit_code="1:0",
        reason="NonZeroExitCode",
        end=now + 6 * S,
        sections="§2.3 (hint block), §2.4 (CUBLAS_STATUS_ALLOC_FAILED), §2.5, §1.2, §3.21",
        tags=["cascade", "nomap", "fqdn", "reverse-dns"],
    )


def a_xid31_every_gpu(seed: int) -> Spec:
    nodes = ["hpc-g17", "hpc-g18"]
    J = Job(
        seed,
        cluster="delta",
        job_id="3340021",
        nodes=nodes,
        start=t("2026-09-21 08:15:00"),
        nccl="2.21.5",
        nccl_debug="WARN",
        script="train_moe.py",
    )
    J.setup()
    now = J.steps(J.start + 30 * S, 1, 12, 7.0, ranks=[0])
    fail = now + 5 * S
    for n in nodes:
        kl = klog(J, n, "raw")
        for r in J.ranks_on(n):
            kl.kern(
                fail + timedelta(milliseconds=60 * (r % 8)),
                xid(PCI[r % 8], 31, pid=J.pid[r], name="python3"),
            )
    for r in range(J.world):
        if r % 3 == 0:
            J.nccl_warn(
                r,
                fail,
                "include/checks.h:44",
                "Cuda failure 'an illegal memory access was encountered'",
            )
    for r in range(J.world):
        J.cuda_error(
            r,
            "an illegal memory access was encountered",
            J.train_frames(
                [
                    (f"/workspace/llm/{J.script}", 201, "train", "y = moe_dispatch(x, idx)"),
                    ("/workspace/llm/kernels/dispatch.py", 57, "moe_dispatch", "_k[grid](x, i)"),
                ]
            ),
        )
    J.srun("error: hpc-g18: tasks 8-15: Exited with exit code 1")
    J.srun("error: hpc-g17: tasks 0-7: Exited with exit code 1")
    return J.spec(
        "app-xid31-once-on-every-gpu-illegal-access",
        "application",
        [],
        "All 16 ranks hit 'an illegal memory access was encountered' in the same custom MoE "
        "kernel and each of the 16 GPUs logs Xid 31 exactly once: the same Xid on different "
        "GPUs is an application bug, and no GPU repeats it (§3.9, §2.3, §2.8 Xid 31).",
        state="FAILED",
        exit_code="1:0",
        reason="NonZeroExitCode",
        end=fail + 4 * S,
        sections="§2.2 (Cuda failure), §2.3, §2.8 (Xid 31), §3.9",
        tags=["map", "srun-l"],
    )


def a_cgroup_oom_singular(seed: int) -> Spec:
    nodes = ["g2-r1-s01", "g2-r1-s02", "g2-r1-s03"]
    J = Job(
        seed,
        cluster="loam",
        job_id="881204",
        nodes=nodes,
        start=t("2026-10-05 19:05:00"),
        script="train_vlm.py",
    )
    J.setup()
    now = J.steps(J.start + 25 * S, 1, 90, 6.0, ranks=[0, 16])
    bad = 11
    fail = now + 3 * S
    kl = klog(J, "g2-r1-s02", "isoj", tz=-420)
    kl.kern(
        fail,
        f"Memory cgroup out of memory: Killed process {J.pid[bad] + 17} (pt_data_worker) "
        "total-vm:61234880kB, anon-rss:48870212kB, file-rss:10240kB, shmem-rss:4194304kB, "
        "UID:20417 pgtables:96112kB oom_score_adj:0",
    )
    klog(J, "g2-r1-s01", "isoj", tz=-420)
    J.traceback(
        bad,
        J.train_frames(
            [
                (f"/workspace/llm/{J.script}", 176, "train", "batch = next(it)"),
                (
                    f"{TORCH}/utils/data/_utils/signal_handling.py",
                    73,
                    "handler",
                    "_error_if_any_worker_fails()",
                ),
            ]
        ),
        [f"RuntimeError: DataLoader worker (pid {J.pid[bad] + 17}) is killed by signal: Killed."],
    )
    J.raw(
        "slurmstepd: error: Detected 1 oom_kill event in StepId=881204.0. Some of the step "
        "tasks have been OOM Killed."
    )
    J.srun(f"error: g2-r1-s02: task {bad}: Out Of Memory")
    for i, r in enumerate(others(J, [bad])):
        J.remote_exit(r, fail + 2 * S + timedelta(milliseconds=44 * i), teardown=i % 5 == 0)
    srun_rest(J, "Aborted (core dumped)", skip_ranks=(bad,))
    return J.spec(
        "app-cgroup-oom-singular-event-out-of-memory-state",
        "application",
        [],
        "The Slurm >=23.02 singular cgroup line 'Detected 1 oom_kill event in StepId=881204.0' "
        "with 'srun: error: g2-r1-s02: task 11: Out Of Memory', the kernel's 'Memory cgroup out "
        "of memory' record and state OUT_OF_MEMORY: host memory, an application fault "
        "(§2.12 cgroup OOM, §3.1, §2.7, §2.13).",
        state="OUT_OF_MEMORY",
        exit_code="0:125",
        reason="OutOfMemory",
        end=fail + 5 * S,
        sections="§2.7 (OOM killer), §2.12 (cgroup OOM >=23.02 singular, srun OOM), §2.13, §3.1",
        tags=["cascade", "map", "srun-l", "tz"],
    )


def a_sigsegv_torchrun_xid43(seed: int) -> Spec:
    nodes = ["c612-011", "c612-012", "c612-013", "c612-014"]
    J = Job(
        seed,
        cluster="cedar",
        job_id="5521907",
        nodes=nodes,
        gpn=4,
        layout="torchrun",
        rank_prefix=False,
        ranks_map=False,
        start=t("2026-11-12 02:40:00"),
        fqdn="hpc.example.edu",
        script="train_vit.py",
    )
    J.setup()
    now = J.steps(J.start + 35 * S, 1, 80, 4.5, ranks=[0])
    bad, node = 9, "c612-013"
    fail = now + 2 * S
    kl = klog(J, node, "caller")
    kl.kern(
        fail,
        f"pt_main_thread[{J.pid[bad]}]: segfault at 18 ip 00007f3a9c2d41e7 sp 00007f3a1bffe9a0 "
        "error 4 in libtorch_cuda.so[7f3a9a200000+3f4c000]",
        level=6,
    )
    kl.kern(fail + 1 * S, xid(PCI[bad % 4], 43))
    J.say(bad, "Fatal Python error: Segmentation fault")
    for i, r in enumerate(others(J, J.ranks_on(node))):
        J.remote_exit(r, fail + 3 * S + timedelta(milliseconds=70 * i), teardown=i % 3 == 0)
    J.child_failed(
        node,
        [(bad, -11, fail, sig(J, bad, 11, "SIGSEGV"))]
        + [(r, -15, fail + 1 * S, sig(J, r, 15, "SIGTERM")) for r in J.ranks_on(node) if r != bad],
        rule=54,
    )
    for n in nodes:
        if n != node:
            J.child_failed(
                n, [(r, -6, fail + 4 * S, sig(J, r, 6, "SIGABRT")) for r in J.ranks_on(n)], rule=54
            )
    J.srun(f"error: {node}: task 2: Exited with exit code 1")
    srun_rest(J, "Exited with exit code 1", skip_nodes=(node,))
    return J.spec(
        "app-sigsegv-torchrun-with-xid43-after",
        "application",
        [],
        "Rank 9's worker dies with 'exitcode  : -11' / 'Signal 11 (SIGSEGV)' and the kernel's "
        "segfault record in libtorch_cuda.so; the Xid 43 a second later is the GPU stopping "
        "after the crash, never a reason to isolate, and the SIGABRT exits are cascade (§2.5, "
        "§2.7, §3.9).",
        state="FAILED",
        exit_code="1:0",
        reason="NonZeroExitCode",
        end=fail + 6 * S,
        sections="§2.5 (exitcode -11), §2.7 (segfault), §2.8 (Xid 43), §3.9, §3.21",
        tags=["cascade", "nomap", "srun-l", "fqdn", "red-herring"],
    )


def a_nccl_invalid_argument(seed: int) -> Spec:
    nodes = [f"gpu-x4-{i:03d}" for i in range(1, 5)]
    J = Job(
        seed,
        cluster="bay",
        job_id="417733",
        nodes=nodes,
        gpn=4,
        start=t("2026-12-01 10:00:00"),
        nccl="2.22.3",
        script="train_seg.py",
    )
    J.setup()
    for r in range(J.world):
        J.dist_backend(
            r,
            "invalid argument (run with NCCL_DEBUG=WARN for details)",
            expl="ncclInvalidArgument: Invalid value for an argument.",
        )
    J.srun("error: gpu-x4-003: tasks 8-11: Exited with exit code 1")
    srun_rest(J, "Exited with exit code 1", skip_nodes=("gpu-x4-003",))
    return J.spec(
        "app-nccl-invalid-argument-first-collective",
        "application",
        [],
        "Every rank fails its first all_reduce with 'NCCL error in: ... invalid argument (run "
        "with NCCL_DEBUG=WARN for details)', which §2.2 maps to application; no training step "
        "ever ran and the first srun line only says where tasks 8-11 ran (§2.1, §2.2).",
        state="FAILED",
        exit_code="1:0",
        reason="NonZeroExitCode",
        end=J.start + 95 * S,
        sections="§2.1 (DistBackendError), §2.2 (invalid argument), §2.12",
        tags=["map", "srun-l"],
        last_progress=False,
    )


# =========================================================================================
# infrastructure
# =========================================================================================
def i_enotconn_checkpoint(seed: int) -> Spec:
    nodes = [f"xe9680-{i:02d}" for i in range(1, 9)]
    J = Job(
        seed,
        cluster="stratus",
        job_id="2290183",
        nodes=nodes,
        start=t("2026-04-22 00:30:00"),
        script="pretrain_gpt.py",
    )
    J.setup("/lustre/proj/ckpt/", 10000, 400000)
    now = J.megatron(J.start + 100 * S, 10000, 400000, 40, 33.0, every=50)
    path = "/lustre/proj/ckpt"
    J.raw(f"{J.label(0)}saving checkpoint at iteration {12000:>7} to {path}")
    fail = now + 14 * S
    J.traceback(
        0,
        J.train_frames(
            [
                (f"/workspace/llm/{J.script}", 352, "train", "save_checkpoint(it, model, opt)"),
                (
                    "/workspace/megatron/megatron/training/checkpointing.py",
                    480,
                    "save_checkpoint",
                    "dist_checkpointing.save(state_dict, ckpt_dir, strategy)",
                ),
                (
                    f"{TORCH}/distributed/checkpoint/filesystem.py",
                    460,
                    "_write_files_from_queue",
                    'with create_stream(file_name, "wb") as stream:',
                ),
            ]
        ),
        [
            "OSError: [Errno 107] Transport endpoint is not connected: "
            f"'{path}/iter_0012000/__0_0.distcp'"
        ],
    )
    J.srun("error: xe9680-01: task 0: Exited with exit code 1")
    klog(J, "xe9680-01", "iso", tz=-240)
    for i, r in enumerate(others(J, [0])):
        short_timeout(J, r, fail + 600 * S + timedelta(milliseconds=19 * i), 3000517, "BARRIER")
    srun_rest(J, "Aborted (core dumped)", skip_ranks=(0,))
    return J.spec(
        "infra-lustre-enotconn-during-checkpoint-save",
        "infrastructure",
        [],
        "Rank 0 fails writing the checkpoint it had started ('saving checkpoint at iteration "
        "12000') with 'OSError: [Errno 107] Transport endpoint is not connected' on /lustre: a "
        "lost filesystem mount, infrastructure; the 63 watchdog timeouts at the barrier are "
        "cascade (§4 storage row, §2.14 save started, §1.1 rule 1).",
        state="FAILED",
        exit_code="1:0",
        reason="NonZeroExitCode",
        end=fail + 605 * S,
        sections="§1.1, §2.1, §2.14 (save started), §4 (storage or filesystem)",
        tags=["cascade", "map", "srun-l"],
    )


def i_oom_after_requeue_leftover(seed: int) -> Spec:
    nodes = ["gpu-q-17", "gpu-q-18"]
    J = Job(
        seed,
        cluster="quartz",
        job_id="7730412",
        nodes=nodes,
        start=t("2026-05-06 12:00:00"),
        script="pretrain_llama.py",
    )
    J.setup("/ckpt/llama-13b/", 21000, 80000)
    J.nccl_init()
    now = J.megatron(J.start + 60 * S, 21000, 80000, 40, 16.0)
    last = J.last_progress
    rq = now + 40 * S
    J.stepd(f"JOB {J.job_id} ON gpu-q-17 CANCELLED AT {iso(rq)} DUE TO JOB REQUEUE")
    # second attempt, appended to the same file (--open-mode=append)
    old_pid = dict(J.pid)
    J.pid = {r: J.rng.randint(100000, 999999) for r in range(J.world)}
    J.start = rq + 150 * S
    J.setup("/ckpt/llama-13b/", 21000, 80000)
    fail = J.start + 40 * S
    for r in J.ranks_on("gpu-q-18"):
        g = r % 8
        J.traceback(
            r,
            J.train_frames([(f"/workspace/llm/{J.script}", 118, "build", "model = model.cuda()")]),
            [
                f"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.50 GiB. GPU {g} "
                "has a total capacity of 79.10 GiB of which 402.00 MiB is free. Process "
                f"{old_pid[r]} has 76.84 GiB memory in use. Including non-PyTorch memory, this "
                "process has 1.84 GiB memory in use. Of the allocated memory 1.21 GiB is "
                "allocated by PyTorch, and 96.00 MiB is reserved by PyTorch but unallocated. If "
                "reserved but unallocated memory is large try setting "
                "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See "
                "documentation for Memory Management  "
                "(https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)"
            ],
        )
    J.srun("error: gpu-q-18: tasks 8-15: Exited with exit code 1")
    for i, r in enumerate(J.ranks_on("gpu-q-17")):
        J.tcpstore(r, fail + 2 * S + timedelta(milliseconds=60 * i), 1)
    J.srun("error: gpu-q-17: tasks 0-7: Exited with exit code 1")
    J.last_progress = last
    return J.spec(
        "infra-cuda-oom-at-restart-gpu-held-by-old-attempt",
        "infrastructure",
        [],
        "Right after the requeue, all 8 ranks on gpu-q-18 hit CUDA OOM while moving the model to "
        "the GPU, and each message says another process holds 76.84 GiB: those PIDs are the "
        "previous attempt's ranks on that node (their NCCL INFO 'gpu-q-18:<pid>' prefixes), so "
        "the GPUs were never released; §2.4 files an "
        "OOM right after a restart on a GPU still holding another process's memory as "
        "infrastructure (our inference there).",
        state="FAILED",
        exit_code="1:0",
        reason="NonZeroExitCode",
        end=fail + 4 * S,
        sections="§2.2 (NCCL prefix), §2.4 (OOM after a restart), §2.12 (JOB REQUEUE), §3.20",
        tags=["map", "srun-l", "two-attempts", "nccl-info"],
    )


# =========================================================================================
# preemption
# =========================================================================================
def p_step_then_cascade(seed: int) -> Spec:
    nodes = [f"p4d-{i:04d}" for i in range(131, 135)]
    J = Job(
        seed,
        cluster="prairie",
        job_id="502211",
        nodes=nodes,
        srun_l=False,
        ranks_map=False,
        start=t("2026-06-30 21:00:00"),
        nccl="2.27.3",
        nccl_debug="WARN",
        script="train_diffusion.py",
    )
    J.setup()
    now = J.steps(J.start + 60 * S, 1, 220, 4.0, ranks=[0])
    tp = now + 1 * S
    J.stepd(f"STEP {J.job_id}.0 ON p4d-0131 CANCELLED AT {iso(tp)} DUE TO PREEMPTION")
    J.stepd(f"JOB {J.job_id} ON p4d-0131 CANCELLED AT {iso(tp)} DUE TO PREEMPTION")
    for i, r in enumerate(J.ranks_on("p4d-0133")[:4]):
        J.nccl_warn(
            r,
            tp + 1 * S,
            "misc/socket.cc:49",
            f"socketProgress: Connection closed by remote peer {J.ip['p4d-0132']}<{40211 + i}>",
        )
    for i, r in enumerate(range(8, 20)):
        J.remote_exit(r, tp + 2 * S + timedelta(milliseconds=80 * i), teardown=i < 3)
    return J.spec(
        "preempt-step-and-job-then-remote-exit-noise",
        "preemption",
        [],
        "'*** STEP 502211.0 ... DUE TO PREEMPTION ***' and the JOB line, state PREEMPTED; the "
        "'Connection closed by remote peer' and remote-exit watchdog lines all come after the "
        "preemption time and are teardown, not a cause (§2.12, §2.13, §1.1 rule 4).",
        state="PREEMPTED",
        exit_code="0:15",
        reason="Preempted",
        end=tp + 5 * S,
        sections="§1.1 rule 4, §2.2 (socketProgress), §2.12 (PREEMPTION), §2.13",
        tags=["nomap", "red-herring"],
    )


def p_killed_after_grace(seed: int) -> Spec:
    nodes = ["hx-021", "hx-022"]
    J = Job(
        seed,
        cluster="fen",
        job_id="99120",
        nodes=nodes,
        gpn=4,
        layout="torchrun",
        rank_prefix=False,
        ranks_map=False,
        start=t("2026-01-09 07:00:00"),
        script="train_asr.py",
    )
    J.setup()
    now = J.steps(J.start + 30 * S, 1, 300, 2.0, ranks=[0])
    tp = now + 1 * S
    J.stepd(f"JOB {J.job_id} ON hx-021 CANCELLED AT {iso(tp)} DUE TO PREEMPTION")
    J.srun("Job step aborted: Waiting up to 32 seconds for job step to finish.")
    J.raw(f"{J.label(4)}Killed")
    J.raw(f"{J.label(0)}Killed")
    J.srun("error: Timed out waiting for job step to complete")
    return J.spec(
        "preempt-job-line-then-bare-killed",
        "preemption",
        [],
        "'*** JOB 99120 ON hx-021 CANCELLED AT ... DUE TO PREEMPTION ***' and state PREEMPTED; the "
        "two bare 'Killed' lines that follow are the SIGKILL after the grace period, confirmed "
        "by the scheduler's preemption (§2.12, §2.13, §3.12).",
        state="PREEMPTED",
        exit_code="0:9",
        reason="Preempted",
        end=tp + 34 * S,
        sections="§2.7 (bare Killed), §2.12 (PREEMPTION, srun teardown), §2.13, §3.12",
        tags=["nomap", "srun-l"],
    )


# =========================================================================================
# time_limit
# =========================================================================================
def tl_slow_iterations(seed: int) -> Spec:
    nodes = ["r2u07", "r2u09", "r2u11", "r2u13", "r2u15", "r2u17"]
    J = Job(
        seed,
        cluster="karst",
        job_id="6012044",
        nodes=nodes,
        start=t("2026-08-01 01:00:00"),
        script="pretrain_gpt.py",
    )
    J.setup("/lustre/ckpt/gpt-30b/", 500, 20000)
    now = J.megatron(J.start + 200 * S, 500, 20000, 45, 240.0)
    klog(J, "r2u11", "bsd", tz=120).kern(
        now - 2 * 60 * M,
        xid(
            "0000:5d:00",
            63,
            "Row Remapper: New row marked for remapping, reset gpu to activate.",
            1896,
        ),
    )
    klog(J, "r2u07", "bsd", tz=120)
    end = J.last_progress + 210 * S
    J.stepd(f"JOB {J.job_id} ON r2u07 CANCELLED AT {iso(end)} DUE TO TIME LIMIT")
    J.srun("Job step aborted: Waiting up to 32 seconds for job step to finish.")
    J.srun(f"Force Terminated StepId={J.job_id}.0")
    return J.spec(
        "timelimit-slow-iterations-old-xid63",
        "time_limit",
        [],
        "'*** JOB 6012044 ON r2u07 CANCELLED AT ... DUE TO TIME LIMIT ***', state TIMEOUT, and the "
        "last iteration line is 210 s before it with one logged every 240 s, so training was "
        "still progressing; r2u11's Xid 63 two hours earlier is informational (§2.12, §2.13, "
        "§3.16, §3.8).",
        state="TIMEOUT",
        exit_code="0:15",
        reason="TimeLimit",
        end=end,
        sections="§2.12 (TIME LIMIT), §2.13, §2.14 (iteration), §3.8, §3.16",
        tags=["map", "srun-l", "red-herring", "tz"],
    )


def tl_step_job_then_cascade(seed: int) -> Spec:
    nodes = ["a40-03", "a40-04"]
    J = Job(
        seed,
        cluster="moor",
        job_id="140077",
        nodes=nodes,
        gpn=4,
        layout="torchrun",
        srun_l=False,
        ranks_map=False,
        start=t("2026-10-20 16:00:00"),
        pt="old",
        nccl="2.18.3",
        script="train_rec.py",
    )
    J.setup()
    now = J.steps(J.start + 20 * S, 1, 170, 5.0, ranks=[0])
    J.saved(170, "/home/u/ckpt/rec")
    now = J.steps(now + 15 * S, 171, 130, 5.0, ranks=[0])
    end = now + 7 * S
    J.stepd(f"STEP {J.job_id}.0 ON a40-03 CANCELLED AT {iso(end)} DUE TO TIME LIMIT")
    J.stepd(f"JOB {J.job_id} ON a40-03 CANCELLED AT {iso(end)} DUE TO TIME LIMIT")
    for i, r in enumerate(range(4, 8)):
        J.remote_exit(r, end + 2 * S + timedelta(milliseconds=50 * i), teardown=i == 0)
    return J.spec(
        "timelimit-step-and-job-lines-then-remote-exit",
        "time_limit",
        [],
        "STEP and JOB lines 'CANCELLED AT ... DUE TO TIME LIMIT', state TIMEOUT, steps every 5 s "
        "until seconds before; the remote-exit watchdog lines on ranks 4-7 come after the time "
        "limit and are teardown (§2.12, §2.13, §3.16).",
        state="TIMEOUT",
        exit_code="0:0",
        reason="TimeLimit",
        end=end,
        sections="§2.1, §2.12 (TIME LIMIT), §2.13, §2.14 (checkpoint saved), §3.16",
        tags=["nomap", "red-herring"],
    )


# =========================================================================================
# user_cancel
# =========================================================================================
def uc_bare_2205_cancelled_by(seed: int) -> Spec:
    nodes = [f"gx-r1-{i:02d}" for i in range(1, 6)]
    J = Job(
        seed,
        cluster="glen",
        job_id="330012",
        nodes=nodes,
        start=t("2026-09-02 13:00:00"),
        script="pretrain_gpt.py",
    )
    J.setup()
    now = J.megatron(J.start + 60 * S, 0, 30000, 40, 25.0)
    tc = now + 9 * S
    J.stepd(f"JOB {J.job_id} ON gx-r1-01 CANCELLED AT {iso(tc)}")
    J.srun("Job step aborted: Waiting up to 32 seconds for job step to finish.")
    for i, r in enumerate((3, 17, 26, 38)):
        J.remote_exit(r, tc + 1 * S + timedelta(milliseconds=120 * i), teardown=False)
    J.srun(f"Force Terminated StepId={J.job_id}.0")
    return J.spec(
        "usercancel-bare-line-cancelled-by-uid",
        "user_cancel",
        [],
        "The Slurm 22.05 bare '*** JOB 330012 ON gx-r1-01 CANCELLED AT ... ***' is settled by "
        "sacct's 'CANCELLED by 20417' and by the absence of any earlier 'srun: error: ... task' "
        "line; the remote-exit lines come after the cancel (§3.3, §2.12, §2.13).",
        state="CANCELLED by 20417",
        exit_code="0:15",
        reason="None",
        end=tc + 3 * S,
        sections="§2.12 (bare cancel, srun teardown), §2.13 (CANCELLED by), §3.3",
        tags=["map", "srun-l"],
    )


def uc_signal_killed_slurm25(seed: int) -> Spec:
    nodes = [f"gpu-h200-{i}" for i in (11, 12, 13)]
    J = Job(
        seed,
        cluster="vale",
        job_id="1200933",
        nodes=nodes,
        layout="torchrun",
        ranks_map=False,
        start=t("2026-11-30 23:10:00"),
        script="train_llm.py",
    )
    J.setup()
    now = J.steps(J.start + 40 * S, 1, 120, 3.0, ranks=[0])
    tc = now + 2 * S
    J.stepd(
        f"STEP {J.job_id}.0 ON gpu-h200-11 CANCELLED AT {iso(tc)} DUE to SIGNAL Killed",
        label=J.label(0),
    )
    for r in (16, 8, 0):
        J.raw(f"{J.label(r)}Killed")
    return J.spec(
        "usercancel-slurm25-due-to-signal-killed",
        "user_cancel",
        [],
        "Slurm 25.05 '*** STEP 1200933.0 ON gpu-h200-11 CANCELLED AT ... DUE to SIGNAL Killed ***' "
        "(lowercase 'to') and sacct 'CANCELLED by 31055': a scancel with SIGKILL, which also "
        "confirms the bare 'Killed' lines (§2.12, §3.2, §3.12, §2.13).",
        state="CANCELLED by 31055",
        exit_code="0:9",
        reason="None",
        end=tc + 2 * S,
        sections="§2.12 (DUE to SIGNAL), §2.13, §3.2, §3.12",
        tags=["nomap", "srun-l"],
    )


# =========================================================================================
# unknown
# =========================================================================================
def u_hostlist_killed(seed: int) -> Spec:
    nodes = [f"gpu-r2-n{i:02d}" for i in range(1, 5)]
    J = Job(
        seed,
        cluster="heath",
        job_id="412990",
        nodes=nodes,
        layout="torchrun",
        rank_prefix=False,
        ranks_map=False,
        start=t("2026-07-19 05:30:00"),
        script="train_audio.py",
    )
    J.setup()
    now = J.steps(J.start + 30 * S, 1, 180, 3.5, ranks=[0])
    for n in nodes:
        klog(J, n, "iso", tz=540, noise=10)
    J.srun("error: gpu-r2-n[01-04]: tasks 0-3: Killed")
    return J.spec(
        "unknown-all-tasks-killed-nothing-confirms",
        "unknown",
        [],
        "The log stops mid-training with 'srun: error: gpu-r2-n[01-04]: tasks 0-3: Killed' on "
        "every node, and no kernel or cgroup OOM record, monitor or scheduler cancel confirms "
        "the kill: unknown until confirmed (§1.1 rules 4 and 6, §3.12).",
        state="FAILED",
        exit_code="0:9",
        reason="NonZeroExitCode",
        end=now + 5 * S,
        sections="§1.1 rules 4 and 6, §2.12 (srun Killed, hostlist), §3.12",
        tags=["nomap", "srun-l", "hostlist", "tz"],
    )


def u_killed_old_oom_record(seed: int) -> Spec:
    nodes = [f"sx-{i:04d}" for i in range(801, 809)]
    J = Job(
        seed,
        cluster="marsh",
        job_id="8800451",
        nodes=nodes,
        start=t("2026-03-09 18:00:00"),
        script="pretrain_gpt.py",
    )
    J.setup("/ckpt/gpt-20b/", 6000, 100000)
    now = J.megatron(J.start + 90 * S, 6000, 100000, 30, 24.0)
    bad = 45
    fail = now + 11 * S
    kl = klog(J, "sx-0806", "iso", tz=-180, boot_days=19)
    kl.kern(
        J.start - timedelta(days=3, hours=2, minutes=14),
        "Out of memory: Killed process 1873344 (python3) total-vm:812334120kB, "
        "anon-rss:498112004kB, file-rss:0kB, shmem-rss:0kB, UID:21877 pgtables:1002112kB "
        "oom_score_adj:0",
    )
    J.srun(f"error: sx-0806: task {bad}: Killed")
    for i, r in enumerate(others(J, [bad])):
        J.remote_exit(r, fail + 2 * S + timedelta(milliseconds=27 * i), teardown=False)
    srun_rest(J, "Aborted (core dumped)", skip_ranks=(bad,))
    return J.spec(
        "unknown-one-rank-killed-oom-record-days-earlier",
        "unknown",
        [],
        "'srun: error: sx-0806: task 45: Killed' has no confirmation: the only OOM-killer record "
        "on sx-0806 is from another user's process three days before this job started, outside "
        "any window, so the kill stays unknown; the 63 remote-exit lines are cascade (§3.12, "
        "§1.1 rules 4-5).",
        state="FAILED",
        exit_code="0:9",
        reason="NonZeroExitCode",
        end=fail + 5 * S,
        sections="§1.1 rules 4-5, §2.7, §2.12 (srun Killed), §3.12",
        tags=["cascade", "map", "srun-l", "red-herring", "tz"],
    )


SCENARIOS = [
    g_xid149_nvlink5,
    g_two_nodes_mig48_xid95,
    n_ib_fatal_failed_device,
    n_ib_retry_every_node,
    f_sixteen_nodes_torchrun,
    f_two_nodes_hostlist_gap,
    h_nvrx_one_rank,
    h_all_ranks_hostlist_abort,
    a_shape_mismatch_16node,
    a_cublas_alloc_reverse_dns,
    a_xid31_every_gpu,
    a_cgroup_oom_singular,
    a_sigsegv_torchrun_xid43,
    a_nccl_invalid_argument,
    i_enotconn_checkpoint,
    i_oom_after_requeue_leftover,
    p_step_then_cascade,
    p_killed_after_grace,
    tl_slow_iterations,
    tl_step_job_then_cascade,
    uc_bare_2205_cancelled_by,
    uc_signal_killed_slurm25,
    u_hostlist_killed,
    u_killed_old_oom_record,
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


BEGIN, END = "<!-- table: written by make_holdout.py -->", "<!-- /table -->"


def main() -> None:
    for old in HERE.iterdir():
        if old.is_dir() and old.name[:2].isdigit() and old.name[2] == "-":
            shutil.rmtree(old)
    rows = []
    for i, fn in enumerate(SCENARIOS, 1):
        spec = fn(7000 + i)
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
    if readme.is_file():
        text = readme.read_text()
        a, b = text.index(BEGIN) + len(BEGIN), text.index(END)
        readme.write_text(text[:a] + "\n" + table + text[b:])
    else:
        print(table)
    print(f"wrote {len(rows)} bundles")


if __name__ == "__main__":
    main()
