"""Building blocks for make_corpus.py: real line formats from docs/failure-signatures.md.

Every error, cascade, teardown or scheduler line built here follows a format quoted in
docs/failure-signatures.md (section named in each helper). Progress lines and benign noise
(NCCL INFO, Python warnings, slurmd/systemd syslog) are the only other text.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

PCI = [
    "0000:18:00",
    "0000:2a:00",
    "0000:3a:00",
    "0000:5d:00",
    "0000:9a:00",
    "0000:ab:00",
    "0000:ba:00",
    "0000:db:00",
]

MSG = {
    79: "GPU has fallen off the bus.",
    48: "An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer "
    "at physAddr 0x7fdf0de80 partition 5, subpartition 1",
    95: "Uncontained: LTC TAG (0x2,0x0). RST: Yes, D-RST: No",
    74: "NVLink: fatal error detected on link 14(0x0, 0x0, 0x10000, 0x0, 0x0, 0x0, 0x0)",
    119: "Timeout after 6s of waiting for RPC response from GPU0 GSP! Expected function 76 "
    "(GSP_RM_CONTROL) (0x20802a02 0x8).",
    94: "Contained ECC error.",
    63: "Row Remapper: New row marked for remapping, reset gpu to activate.",
    # Synthetic (no real Xid 64 sample exists; built from the format, see README).
    64: "Row Remapper: row remapping failed, reset gpu to activate.",
    13: "Graphics SM Warp Exception on (GPC 1, TPC 3, SM 0): Out Of Range Address",
    31: "channel 0x00000002, intr 00000000. MMU Fault: ENGINE GRAPHICS GPC6 GPCCLIENT_T1_13 "
    "faulted @ 0x6f6f_320c2000. Fault is of type FAULT_PDE ACCESS_TYPE_VIRT_READ",
    43: "Ch 00000020, engmask 00000101",
    154: "GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)",
}
GSP_BANNER = (
    "NVRM: _kgspLogXid119: ********************************* GSP Timeout "
    "**********************************"
)
CUDA_HINT_NEW = [
    "CUDA kernel errors might be asynchronously reported at some other API call, so the "
    "stacktrace below might be incorrect.",
    "For debugging consider passing CUDA_LAUNCH_BLOCKING=1",
    "Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.",
]
CUDA_HINT_OLD = [
    CUDA_HINT_NEW[0],
    "For debugging consider passing CUDA_LAUNCH_BLOCKING=1.",
    CUDA_HINT_NEW[2],
]
REMOTE_EXPL = (
    "ncclRemoteError: A call failed possibly due to a network error or a remote process "
    "exiting prematurely."
)
TORCH = "/usr/local/lib/python3.11/dist-packages/torch"


def t(s: str) -> datetime:
    return datetime.fromisoformat(s).replace(tzinfo=UTC)


def iso(d: datetime) -> str:
    return d.strftime("%Y-%m-%dT%H:%M:%S")


def xid(
    pci: str, code: int, msg: str | None = None, pid: int | str | None = None, name: str = "python3"
) -> str:
    """NVRM Xid line (§2.8 formats)."""
    msg = msg if msg is not None else MSG[code]
    if pid is None:
        return f"NVRM: Xid (PCI:{pci}): {code}, {msg}"
    if pid == "unknown":
        return f"NVRM: Xid (PCI:{pci}): {code}, pid='<unknown>', name=<unknown>, {msg}"
    return f"NVRM: Xid (PCI:{pci}): {code}, pid={pid}, name={name}, {msg}"


class NodeLog:
    """One node's kernel/syslog lines in one of the §0 prefix styles."""

    def __init__(self, node: str, style: str, boot: datetime, rng: random.Random):
        self.node, self.style, self.boot, self.rng = node, style, boot, rng
        self.rows: list[tuple[datetime, str]] = []

    def _up(self, when: datetime) -> str:
        s = (when - self.boot).total_seconds() + self.rng.random()
        whole = int(s)
        return f"[{whole:5d}.{int((s - whole) * 1e6):06d}]"

    def kern(self, when: datetime, text: str, level: int = 3) -> None:
        up = self._up(when)
        us = self.rng.randint(0, 999999)
        st = self.style
        if st == "iso":
            line = f"{when:%Y-%m-%dT%H:%M:%S}.{us:06d}+00:00 {self.node} kernel: {up} {text}"
        elif st == "bsd":
            line = f"{when:%b} {when.day:>2} {when:%H:%M:%S} {self.node} kernel: {up} {text}"
        elif st == "journal":
            line = f"{when:%b} {when.day:>2} {when:%H:%M:%S} {self.node} kernel: {text}"
        elif st == "raw":
            line = f"<{level}>{up} {text}"
        elif st == "caller":
            line = f"{up}[{'T' + str(self.rng.randint(900, 4000)):>6}] {text}"
        else:  # dmesg
            line = f"{up} {text}"
        self.rows.append((when, line))

    def daemon(self, when: datetime, proc: str, text: str) -> None:
        """A non-kernel syslog line (only in syslog styles)."""
        us = self.rng.randint(0, 999999)
        if self.style == "iso":
            line = f"{when:%Y-%m-%dT%H:%M:%S}.{us:06d}+00:00 {self.node} {proc}: {text}"
        elif self.style in ("bsd", "journal"):
            line = f"{when:%b} {when.day:>2} {when:%H:%M:%S} {self.node} {proc}: {text}"
        else:
            return
        self.rows.append((when, line))

    def noise(self, start: datetime, end: datetime, n: int, job_id: str) -> None:
        rng = self.rng
        span = max(1, int((end - start).total_seconds()))
        for _ in range(n):
            when = start + timedelta(seconds=rng.randint(0, span))
            k = rng.randint(0, 7)
            if k == 0:
                self.daemon(
                    when,
                    "systemd[1]",
                    f"Started session-{rng.randint(1000, 9999)}"
                    f".scope - Session {rng.randint(1000, 9999)} of User root.",
                )
            elif k == 1:
                self.daemon(
                    when,
                    f"chronyd[{rng.randint(900, 1400)}]",
                    "Selected source 10.0.0.1 (ntp1.cluster.example.com)",
                )
            elif k == 2:
                self.daemon(
                    when,
                    f"slurmd[{rng.randint(2000, 3000)}]",
                    f"slurmd: launch task StepId={job_id}.0 request from UID:10423 "
                    f"GID:10423 HOST:10.0.0.5 PORT:{rng.randint(30000, 60000)}",
                )
            elif k == 3:
                self.kern(
                    when,
                    "mlx5_cmd_out_err:838:(pid 1441871): ACCESS_REG(0x805) "
                    "op_mod(0x1) failed, status bad operation(0x2), syndrome (0x305684), "
                    "err(-22)",
                    level=6,
                )
            elif k == 4:
                self.daemon(
                    when,
                    "systemd-logind[1187]",
                    f"New session {rng.randint(1000, 9999)} of user slurm.",
                )
            elif k == 5:
                self.kern(
                    when,
                    f"perf: interrupt took too long ({rng.randint(2500, 4000)} > "
                    f"{rng.randint(2400, 2500)}), lowering kernel.perf_event_max_sample_rate"
                    f" to {rng.randint(40000, 80000)}",
                    level=4,
                )
            elif k == 6:
                self.daemon(
                    when,
                    "sshd[4312]",
                    "Accepted publickey for root from 10.0.0.2 port "
                    f"{rng.randint(30000, 60000)} ssh2: ED25519 SHA256:kq7x0p2",
                )
            else:
                self.daemon(
                    when,
                    f"nvidia-persistenced[{rng.randint(1500, 1600)}]",
                    "Verbose syslog connection opened",
                )

    def text(self) -> str:
        return "".join(line + "\n" for _, line in sorted(self.rows, key=lambda r: r[0]))


@dataclass
class Spec:
    slug: str
    category: str
    culprits: list[str]
    why: str
    job: dict
    log: str
    node_logs: dict[str, str] = field(default_factory=dict)
    telemetry: list[dict] = field(default_factory=list)
    sections: str = ""
    tags: list[str] = field(default_factory=list)
    # The culprits are named only by job-controlled evidence (the job's output): no kernel log,
    # telemetry, Slurm node state or probe confirms them (docs/trust.md).
    job_only: bool = False

    @property
    def action(self) -> str:
        """The design's default action for this label (docs/attribution.md, docs/trust.md)."""
        if self.category in ("gpu_hardware", "network", "node_failure", "hang"):
            if not self.culprits:
                return "restart"
            return "exclude_and_restart" if self.job_only else "isolate_and_restart"
        return {
            "infrastructure": "restart",
            "application": "hold",
            "unknown": "restart",
        }.get(self.category, "none")


class Job:
    """A training job whose output we write line by line."""

    def __init__(
        self,
        seed: int,
        *,
        cluster: str,
        job_id: str,
        nodes: list[str],
        gpn: int = 8,
        layout: str = "per_gpu",
        srun_l: bool = True,
        rank_prefix: bool = True,
        ranks_map: bool = True,
        start: datetime,
        pt: str = "new",
        nccl: str = "2.21.5",
        nccl_debug: str | None = None,
        fqdn: str | None = None,
        script: str = "pretrain_gpt.py",
    ):
        self.rng = random.Random(seed)
        self.cluster, self.job_id, self.nodes, self.gpn = cluster, job_id, nodes, gpn
        self.layout, self.srun_l, self.rank_prefix = layout, srun_l, rank_prefix
        self.ranks_map, self.start, self.pt, self.nccl = ranks_map, start, pt, nccl
        self.nccl_debug, self.fqdn, self.script = nccl_debug, fqdn, script
        self.world = len(nodes) * gpn
        self.lines: list[str] = []
        self.pid = {r: self.rng.randint(100000, 999999) for r in range(self.world)}
        net = self.rng.randint(10, 60)
        self.ip = {n: f"10.{net}.{i // 200}.{11 + i % 200}" for i, n in enumerate(nodes)}
        self.last_progress: datetime | None = None
        self.nodelogs: dict[str, NodeLog] = {}

    # ---- prefixes (§0, §1.2) -------------------------------------------------------------
    def node(self, r: int) -> str:
        return self.nodes[r // self.gpn]

    def host(self, node: str) -> str:
        return f"{node}.{self.fqdn}" if self.fqdn else node

    def label(self, r: int) -> str:
        if not self.srun_l:
            return ""
        if self.layout == "per_gpu":
            return f"{r:>{len(str(self.world - 1))}}: "
        return f"{r // self.gpn:>{len(str(len(self.nodes) - 1))}}: "

    def node_label(self, node: str) -> str:
        return self.label(self.nodes.index(node) * self.gpn)

    def p(self, r: int) -> str:
        return self.label(r) + (f"[rank{r}]:" if self.rank_prefix else "")

    def say(self, r: int, text: str) -> None:
        sep = " " if self.rank_prefix else ""
        self.lines.append(f"{self.p(r)}{sep}{text}")

    def raw(self, text: str) -> None:
        self.lines.append(text)

    def ranks_on(self, node: str) -> list[int]:
        i = self.nodes.index(node)
        return list(range(i * self.gpn, (i + 1) * self.gpn))

    # ---- c10d (§2.1) ---------------------------------------------------------------------
    def glog(self, when: datetime, lvl: str, line: int) -> str:
        ns = self.rng.randint(0, 999_999_999)
        stamp = f"{lvl}{when.month}{when.day:02d} {when:%H:%M:%S}.{ns:09d}"
        return f"[{stamp} ProcessGroupNCCL.cpp:{line}]"

    def hdr(self, r: int, pg: bool) -> str:
        return f"[PG ID 0 PG GUID 0(default_pg) Rank {r}]" if pg else f"[Rank {r}]"

    def c10(
        self, r: int, when: datetime, lvl: str, line: int, text: str, pg: bool | None = None
    ) -> None:
        pg = (self.pt == "new") if pg is None else pg
        self.lines.append(f"{self.p(r)}{self.glog(when, lvl, line)} {self.hdr(r, pg)} {text}")

    def wd_timeout(
        self,
        r: int,
        when: datetime,
        seq: int,
        op: str = "ALLREDUCE",
        numel: int = 26214400,
        teardown: bool = True,
    ) -> None:
        ran = 600000 + self.rng.randint(3, 95)
        out = numel * self.world if op == "_ALLGATHER_BASE" else numel
        msg = (
            f"Watchdog caught collective operation timeout: WorkNCCL(SeqNum={seq}, OpType={op},"
            f" NumelIn={numel}, NumelOut={out}, Timeout(ms)=600000) ran for {ran} milliseconds"
            " before timing out."
        )
        self.c10(r, when, "E", 632 if self.pt == "new" else 587, msg)
        if teardown:
            self.teardown(r, when + timedelta(milliseconds=40), f"[Rank {r}] {msg}")

    def teardown(self, r: int, when: datetime, what: str) -> None:
        some = (
            "Some NCCL operations have failed or timed out. Due to the asynchronous nature of"
            " CUDA kernels, subsequent GPU operations might run on corrupted/incomplete data."
        )
        if self.pt == "new":
            self.c10(r, when, "E", 1595, some)
            self.c10(
                r,
                when,
                "E",
                1601,
                "To avoid data inconsistency, we are taking the entire process down.",
            )
        else:
            self.c10(
                r,
                when,
                "E",
                915,
                some + " To avoid this inconsistency, we are taking the entire process down.",
            )
        self.say(r, "terminate called after throwing an instance of 'std::runtime_error'")
        self.say(r, f"  what():  {what}")
        self.say(r, "Fatal Python error: Aborted")

    def watchdog_exc(self, r: int, when: datetime, inner: str, teardown: bool = True) -> None:
        word = "Process group" if self.pt == "new" else "NCCL"
        msg = f"{word} watchdog thread terminated with exception: {inner}"
        self.c10(r, when, "E", 1617 if self.pt == "new" else 1182, msg)
        if teardown:
            self.say(r, "terminate called after throwing an instance of 'std::runtime_error'")
            self.say(r, f"  what():  [Rank {r}] {msg}")
            self.say(r, "Fatal Python error: Aborted")

    def remote_exit(self, r: int, when: datetime, teardown: bool = True) -> None:
        self.watchdog_exc(
            r,
            when,
            "NCCL error: remote process exited or there was a network "
            f"error, NCCL version {self.nccl}",
            teardown,
        )

    def heartbeat(self, r: int, when: datetime) -> None:
        self.lines.append(
            f"{self.p(r)}{self.glog(when, 'E', 1484)} Heartbeat monitor timed out! "
            "Process will be terminated after dumping debug info. "
            f"workMetaList_.size()={self.rng.randint(1, 4)}"
        )

    def tcpstore(self, r: int, when: datetime, kind: int = 0) -> None:
        if kind == 0:
            self.c10(r, when, "W", 1280, "Failed to check should dump on TCPStore: Broken pipe")
        elif kind == 1:
            self.say(
                r,
                "TCPStore recvValue failed: Failed to recv, got 0 bytes. Connection was "
                "likely closed.",
            )
        else:
            self.say(
                r,
                "torch.distributed.DistNetworkError: Failed to recv, got 0 bytes. "
                "Connection was likely closed. Did the remote server shutdown or crash?",
            )

    # ---- Python tracebacks ---------------------------------------------------------------
    def traceback(self, r: int, frames: list[tuple[str, int, str, str]], tail: list[str]) -> None:
        self.say(r, "Traceback (most recent call last):")
        for f, ln, fn, code in frames:
            self.say(r, f'  File "{f}", line {ln}, in {fn}')
            self.say(r, f"    {code}")
        for x in tail:
            self.say(r, x)

    def train_frames(self, last: list[tuple[str, int, str, str]]) -> list:
        s = f"/workspace/llm/{self.script}"
        return [
            (s, 412, "<module>", "main()"),
            (s, 388, "main", "train(cfg, model, loader)"),
            *last,
        ]

    def allreduce_frames(self) -> list:
        return self.train_frames(
            [
                (f"/workspace/llm/{self.script}", 301, "train", "dist.all_reduce(loss_t)"),
                (
                    f"{TORCH}/distributed/c10d_logger.py",
                    81,
                    "wrapper",
                    "return func(*args, **kwargs)",
                ),
                (
                    f"{TORCH}/distributed/distributed_c10d.py",
                    2501,
                    "all_reduce",
                    "work = group.allreduce([tensor], opts)",
                ),
            ]
        )

    def dist_backend(self, r: int, err: str, expl: str | None = REMOTE_EXPL) -> None:
        cls = "torch.distributed.DistBackendError" if self.pt == "new" else "RuntimeError"
        tail = [
            f"{cls}: NCCL error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:"
            f"{1970 if self.pt == 'new' else 1691}, {err}, NCCL version {self.nccl}"
        ]
        if expl:
            tail.append(expl)
        self.traceback(r, self.allreduce_frames(), tail)

    def cuda_error(self, r: int, text: str, frames: list | None = None) -> None:
        cls = "torch.AcceleratorError" if self.pt == "new" else "RuntimeError"
        frames = frames or self.train_frames(
            [
                (f"/workspace/llm/{self.script}", 297, "train", "loss = model(batch).loss"),
            ]
        )
        hint = CUDA_HINT_NEW if self.pt == "new" else CUDA_HINT_OLD
        self.traceback(r, frames, [f"{cls}: CUDA error: {text}", *hint, ""])

    # ---- NCCL (§2.2) ---------------------------------------------------------------------
    def nccl_prefix(self, r: int) -> str:
        node = self.node(r).split(".")[0]
        return f"{node}:{self.pid[r]}:{self.pid[r] + self.rng.randint(40, 900)} [{r % self.gpn}]"

    def nccl_warn(self, r: int, when: datetime, src: str, msg: str) -> None:
        stamp = f"[{when:%Y-%m-%d %H:%M:%S}] " if self.nccl >= "2.26" else ""
        self.lines.append(f"{self.label(r)}{stamp}{self.nccl_prefix(r)} {src} NCCL WARN {msg}")

    def nccl_info(self, r: int, msg: str) -> None:
        self.lines.append(f"{self.label(r)}{self.nccl_prefix(r)} NCCL INFO {msg}")

    def nccl_init(self, ranks: list[int] | None = None) -> None:
        ranks = list(range(self.world)) if ranks is None else ranks
        for r in ranks:
            node = self.node(r)
            if r == 0:
                self.nccl_info(r, f"NCCL version {self.nccl}+cuda12.4")
            self.nccl_info(r, f"Bootstrap : Using ib0:{self.ip[node]}<0>")
            self.nccl_info(
                r,
                "NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/IB [2]mlx5_2:1/IB "
                f"[3]mlx5_3:1/IB [RO]; OOB ib0:{self.ip[node]}<0>",
            )
        for r in ranks:
            bus = PCI[r % self.gpn].replace("0000:", "") + ".0"
            self.nccl_info(
                r,
                f"comm 0x{self.rng.randint(0x55D000000000, 0x55DFFFFFFFFF):x} rank "
                f"{r} nranks {self.world} cudaDev {r % self.gpn} nvmlDev {r % self.gpn}"
                f" busId {bus} commId 0x{self.rng.getrandbits(64):016x} - Init COMPLETE",
            )

    # ---- progress and noise (§2.14) ------------------------------------------------------
    def setup(self, ckpt: str | None = None, it: int = 0, total: int = 100000) -> None:
        last = self.world - 1
        self.raw(f"{self.label(last)}setting training iterations to {total}")
        if ckpt:
            self.raw(f"{self.label(0)}loading distributed checkpoint from {ckpt} at iteration {it}")
            self.raw(
                f"{self.label(0)}  successfully loaded checkpoint from {ckpt} "
                f"[ t 1/1, p 1/1 ] at iteration {it}"
            )
        for r in sorted({0, last}):
            self.raw(
                f"{self.label(r)}{TORCH}/nn/modules/module.py:1747: FutureWarning: "
                "`torch.cuda.amp.autocast(args...)` is deprecated. Please use "
                "`torch.amp.autocast('cuda', args...)` instead."
            )
        self.raw(
            f"{self.label(last)}[before the start of training step] datetime: "
            f"{self.start:%Y-%m-%d %H:%M:%S}"
        )

    def megatron(
        self,
        when: datetime,
        it0: int,
        total: int,
        n: int,
        dt: float,
        loss0: float = 2.6,
        every: int = 10,
        gbs: int = 1024,
    ) -> datetime:
        r = self.world - 1
        loss = loss0
        for i in range(n):
            it = it0 + (i + 1) * every
            loss = max(1.2, loss - self.rng.random() * 0.004 + 0.0015)
            ms = dt / every * 1000 * (0.97 + self.rng.random() * 0.06)
            self.raw(
                f"{self.label(r)} [{when:%Y-%m-%d %H:%M:%S}] iteration {it:>8}/{total:>8} | "
                f"consumed samples: {it * gbs:>12} | elapsed time per iteration (ms): "
                f"{ms:.1f} | learning rate: {2.4e-4 * (1 - it / total / 2):.6E} | global "
                f"batch size: {gbs:>5} | lm loss: {loss:.6E} | loss scale: 1.0 | grad norm: "
                f"{0.3 + self.rng.random() * 0.3:.3f} | number of skipped iterations:   0 | "
                "number of nan iterations:   0 |"
            )
            self.last_progress = when
            when += timedelta(seconds=dt)
        return when

    def steps(
        self,
        when: datetime,
        s0: int,
        n: int,
        dt: float,
        ranks: list[int] | None = None,
        loss0: float = 3.1,
        nan_from: int | None = None,
    ) -> datetime:
        ranks = [0] if ranks is None else ranks
        loss = loss0
        for i in range(n):
            s = s0 + i
            loss = max(0.8, loss - self.rng.random() * 0.01 + 0.003)
            for r in ranks:
                val = "nan" if nan_from is not None and s >= nan_from else f"{loss:.4f}"
                self.raw(f"{self.label(r)}step={s} loss={val} rank={r} node={self.node(r)}")
            self.last_progress = when
            when += timedelta(seconds=dt)
        return when

    def saved(self, it: int, path: str) -> None:
        self.raw(f"{self.label(0)}saving checkpoint at iteration {it:>7} to {path}")
        self.raw(f"{self.label(0)}  successfully saved checkpoint from iteration {it:>7} to {path}")

    # ---- torchrun (§2.5) -----------------------------------------------------------------
    def child_failed(
        self, node: str, fails: list[tuple[int, int, datetime, str]], rule: int = 60
    ) -> None:
        """fails: (rank, exitcode, time, traceback) — first is the root cause on this node."""
        lab = self.node_label(node)
        out = [
            "Traceback (most recent call last):",
            '  File "/usr/local/bin/torchrun", line 8, in <module>',
            "    sys.exit(main())",
            f'  File "{TORCH}/distributed/elastic/multiprocessing/errors/__init__.py", '
            "line 355, in wrapper",
            "    return f(*args, **kwargs)",
            f'  File "{TORCH}/distributed/launcher/api.py", line 263, in launch_agent',
            "    raise ChildFailedError(",
            "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ",
            "=" * rule,
            f"{self.script} FAILED",
            "-" * rule,
            "Failures:",
        ]

        def block(i: int, f: tuple[int, int, datetime, str]) -> list[str]:
            r, code, when, tb = f
            return [
                f"[{i}]:",
                f"  time      : {when:%Y-%m-%d_%H:%M:%S}",
                f"  host      : {self.host(node)}",
                f"  rank      : {r} (local_rank: {r % self.gpn})",
                f"  exitcode  : {code} (pid: {self.pid[r]})",
                "  error_file: <N/A>",
                f"  traceback : {tb}",
            ]

        if len(fails) == 1:
            out.append("  <NO_OTHER_FAILURES>")
        else:
            for i, f in enumerate(fails[1:], 1):
                out += block(i, f)
        out += ["-" * rule, "Root Cause (first observed failure):", *block(0, fails[0]), "=" * rule]
        self.lines += [lab + x for x in out]

    # ---- Slurm (§2.12) -------------------------------------------------------------------
    def srun(self, text: str) -> None:
        self.raw(f"srun: {text}")

    def stepd(self, text: str, label: str = "") -> None:
        self.raw(f"{label}slurmstepd: error: *** {text} ***")

    # ---- node logs -----------------------------------------------------------------------
    def nlog(self, node: str, style: str = "iso", noise: int = 8) -> NodeLog:
        if node not in self.nodelogs:
            boot = self.start - timedelta(
                days=self.rng.randint(3, 40), seconds=self.rng.randint(0, 80000)
            )
            nl = NodeLog(node, style, boot, self.rng)
            nl.noise(
                self.start - timedelta(hours=2), self.start + timedelta(hours=3), noise, self.job_id
            )
            self.nodelogs[node] = nl
        return self.nodelogs[node]

    # ---- output --------------------------------------------------------------------------
    def spec(
        self,
        slug: str,
        category: str,
        culprits: list[str],
        why: str,
        *,
        state: str,
        exit_code: str,
        reason: str,
        end: datetime,
        node_states: dict[str, str] | None = None,
        default_state: str = "ALLOCATED",
        telemetry: list[dict] | None = None,
        sections: str = "",
        tags: list[str] | None = None,
        last_progress: bool = True,
        observed_delay: int = 95,
        job_only: bool = False,
    ) -> Spec:
        states = {n: default_state for n in self.nodes}
        states.update(node_states or {})
        job: dict = {
            "cluster": self.cluster,
            "job_id": self.job_id,
            "state": state,
            "exit_code": exit_code,
            "reason": reason,
            "nodes": self.nodes,
            "node_states": states,
        }
        if self.ranks_map:
            job["ranks"] = {str(r): self.node(r) for r in range(self.world)}
        job["observed_at"] = iso(end + timedelta(seconds=observed_delay)) + "Z"
        if last_progress and self.last_progress is not None:
            job["last_progress_at"] = iso(self.last_progress) + "Z"
        return Spec(
            slug,
            category,
            sorted(culprits),
            why,
            job,
            "".join(x + "\n" for x in self.lines),
            {n: nl.text() for n, nl in sorted(self.nodelogs.items())},
            telemetry or [],
            sections,
            tags or [],
            job_only,
        )


def tel_healthy(
    job: Job, when: datetime, nodes: list[str] | None = None, gpus: int | None = None
) -> list[dict]:
    out = []
    for n in nodes or job.nodes:
        for g in range(gpus if gpus is not None else job.gpn):
            out.append({"node": n, "gpu": g, "time": iso(when) + "Z", "ecc_dbe_volatile": 0})
    return out
