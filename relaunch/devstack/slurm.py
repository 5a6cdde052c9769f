"""A real Slurm cluster of N nodes on this machine: munged on a private socket, one slurmctld,
one ``slurmd -N`` per node, and slurmrestd (local-socket auth and JWT auth)."""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import subprocess
from pathlib import Path

from pydantic import BaseModel

from relaunch.devstack import accounting, procs
from relaunch.devstack.slurm_release import HOST_RELEASE
from relaunch.models.errors import StackError

# The OpenAPI plugin each release's slurmrestd serves in the dev stack: 22.05 names a version;
# 24.11 serves slurmctld's endpoints with every data parser it carries (v0.0.40-v0.0.42).
RESTD_PLUGINS = {"22.05": "openapi/v0.0.38", "24.11": "openapi/slurmctld"}
NO_ACCOUNTING = "AccountingStorageType=accounting_storage/none\n"
SLURM_PACKAGES = ("slurmctld", "slurmd", "slurm-client", "slurmrestd", "munge")


class SlurmLayout(BaseModel):
    """Where one stack's Slurm keeps its files, and the ports it uses."""

    root: Path
    cluster: str
    nodes: list[str]
    slurmctld_port: int
    slurmd_ports: list[int]
    restd_port: int
    cred_expire: int
    slurmd_timeout: int = 300
    node_cpus: int = 2
    preemption: bool = False
    max_job_count: int | None = None
    min_job_age: int = 600
    accounting: bool = False  # slurmdbd and MariaDB: devstack/accounting.py
    release: str = HOST_RELEASE
    slurm_root: Path | None = None  # the Debian root of a release that is not the host's

    @property
    def bin_dir(self) -> Path:
        """The wrappers that run this release's commands (only when it is not the host's)."""
        return self.root / "bin"

    @property
    def conf(self) -> Path:
        return self.root / "slurm.conf"

    @property
    def munge_socket(self) -> Path:
        return self.root / "munge-run" / "munge.socket"

    @property
    def munge_key(self) -> Path:
        return self.root / "munge" / "munge.key"

    @property
    def jwt_key(self) -> Path:
        return self.root / "jwt" / "jwt.key"

    @property
    def restd_socket(self) -> Path:
        return self.root / "run" / "slurmrestd.sock"

    @property
    def env(self) -> dict[str, str]:
        """What a shell needs to use this cluster: its configuration, and for a release that
        is not the host's, its commands first on PATH."""
        env = {"SLURM_CONF": str(self.conf)}
        if self.slurm_root is not None:
            env["PATH"] = f"{self.bin_dir}:{os.environ.get('PATH', os.defpath)}"
        return env

    @property
    def config_fields(self) -> dict[str, str]:
        """The ClusterConfig fields that point Relaunch at this cluster's Slurm."""
        fields = {"slurm_conf": str(self.conf)}
        if self.slurm_root is not None:
            fields["slurm_bin"] = str(self.bin_dir)
        return fields

    @property
    def process_env(self) -> dict[str, str]:
        return {**os.environ, **self.env}

    def node_log(self, node: str) -> Path:
        return self.root / "log" / f"slurmd-{node}.log"


def require_binaries(layout: SlurmLayout) -> None:
    if layout.accounting:
        accounting.require_binaries(layout)
    if layout.slurm_root is not None:
        return  # the release's own root carries every binary
    missing = [
        b for b in ("slurmctld", "slurmd", "sinfo", "munged", "slurmrestd") if not shutil.which(b)
    ]
    if missing:
        raise StackError(
            f"Slurm is not installed (missing: {', '.join(missing)})",
            hint="run `make deps` (installs " + " ".join(SLURM_PACKAGES) + ")",
        )


def write_conf(layout: SlurmLayout) -> None:
    r = layout.root
    for sub in ("state", "spool", "log", "run", "jwt"):
        (r / sub).mkdir(parents=True, exist_ok=True)
    if not layout.jwt_key.exists():
        layout.jwt_key.write_bytes(secrets.token_bytes(32))
        layout.jwt_key.chmod(0o600)
    node_lines = "\n".join(
        f"NodeName={n} NodeHostname={n} NodeAddr=127.0.0.1 Port={p} CPUs={layout.node_cpus} "
        "RealMemory=2000 State=UNKNOWN"
        for n, p in zip(layout.nodes, layout.slurmd_ports, strict=True)
    )
    node_list = ",".join(layout.nodes)
    extra = ""
    if layout.node_cpus != 2:
        # slurmd -N reports the machine's real CPU count; accept the configured one instead.
        extra += "SlurmdParameters=config_overrides\n"
    # Accounting (opt-in): slurmdbd, which the stack runs beside slurmctld (accounting.py).
    extra += accounting.conf_lines(layout) if layout.accounting else NO_ACCOUNTING
    if layout.max_job_count is not None:
        extra += f"MaxJobCount={layout.max_job_count}\nMaxArraySize={layout.max_job_count}\n"
    partitions = f"PartitionName=debug Nodes={node_list} Default=YES MaxTime=INFINITE State=UP"
    # A second partition over the same nodes: where a canary rollout acts alone while debug
    # still asks (tests/integration/test_rollout.py).
    partitions += f"\nPartitionName=batch Nodes={node_list} MaxTime=INFINITE State=UP"
    if layout.preemption:
        # Real partition-priority preemption: a job in `urgent` requeues `debug` jobs it needs.
        extra += "PreemptType=preempt/partition_prio\nPreemptMode=REQUEUE\n"
        partitions += (
            " PriorityTier=1\n"
            f"PartitionName=urgent Nodes={node_list} MaxTime=INFINITE State=UP PriorityTier=10"
        )
    layout.conf.write_text(
        f"""# Written by `relaunch dev up`: a local {len(layout.nodes)}-node development cluster.
ClusterName={layout.cluster}
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort={layout.slurmctld_port}
SlurmdPort={layout.slurmd_ports[0]}
SlurmUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={layout.munge_socket},cred_expire={layout.cred_expire}
AuthAltTypes=auth/jwt
AuthAltParameters=jwt_key={layout.jwt_key}
StateSaveLocation={r}/state
SlurmdSpoolDir={r}/spool/%n
SlurmctldPidFile={r}/run/slurmctld.pid
SlurmdPidFile={r}/run/slurmd-%n.pid
SlurmctldLogFile={r}/log/slurmctld.log
SlurmdLogFile={r}/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
# The dev cluster schedules eagerly so that restart timings measure Slurm's rules, not its idling.
SchedulerParameters=sched_interval=2,bf_interval=2
JobFileAppend=1
ReturnToService=2
SlurmdTimeout={layout.slurmd_timeout}
MinJobAge={layout.min_job_age}
MpiDefault=none
JobCompType=jobcomp/none
JobAcctGatherType=jobacct_gather/none
{extra}{node_lines}
{partitions}
"""
    )


def start_munge(layout: SlurmLayout) -> None:
    key_dir = layout.munge_key.parent
    key_dir.mkdir(parents=True, exist_ok=True)
    (layout.root / "log").mkdir(parents=True, exist_ok=True)
    key_dir.chmod(0o700)
    layout.munge_socket.parent.mkdir(parents=True, exist_ok=True)
    layout.munge_socket.parent.chmod(0o755)
    if not layout.munge_key.exists():
        layout.munge_key.write_bytes(secrets.token_bytes(1024))
    layout.munge_key.chmod(0o600)
    if munge_healthy(layout):
        return
    pid_file = key_dir / "munged.pid"
    result = subprocess.run(
        [
            "munged",
            "--force",
            f"--socket={layout.munge_socket}",
            f"--key-file={layout.munge_key}",
            f"--log-file={layout.root / 'log' / 'munged.log'}",
            f"--pid-file={pid_file}",
            f"--seed-file={key_dir / 'munged.seed'}",
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )
    if result.returncode != 0:
        raise StackError(f"munged did not start: {result.stderr.strip()[-300:]}")
    procs.wait_for(lambda: munge_healthy(layout), 10, "munged")


def munge_healthy(layout: SlurmLayout) -> bool:
    pid = procs.read_pid(layout.munge_key.parent / "munged.pid")
    return procs.pid_alive(pid) and layout.munge_socket.exists()


def ctld_pid(layout: SlurmLayout) -> int | None:
    pid = procs.read_pid(layout.root / "run" / "slurmctld.pid")
    return pid if procs.pid_alive(pid) else None


def slurmd_pid(layout: SlurmLayout, node: str) -> int | None:
    pid = procs.read_pid(layout.root / "run" / f"slurmd-{node}.pid")
    return pid if procs.pid_alive(pid) else None


def _daemon(layout: SlurmLayout, argv: list[str], what: str) -> None:
    result = subprocess.run(
        argv, capture_output=True, text=True, timeout=60, env=layout.process_env
    )
    if result.returncode != 0:
        raise StackError(f"{what} did not start: {(result.stderr or result.stdout).strip()[-300:]}")


def start_daemons(layout: SlurmLayout) -> None:
    """Start slurmctld and every slurmd that is not running (idempotent)."""
    conf = str(layout.conf)
    if ctld_pid(layout) is None:
        _daemon(layout, ["slurmctld", "-c", "-f", conf], "slurmctld")
        procs.wait_for(lambda: procs.port_open(layout.slurmctld_port), 30, "slurmctld")
    for node in layout.nodes:
        if slurmd_pid(layout, node) is None:
            _daemon(layout, ["slurmd", "-N", node, "-f", conf], f"slurmd {node}")


def start_restd(layout: SlurmLayout) -> None:
    """slurmrestd twice: local auth on a unix socket, JWT auth on a TCP port."""
    base_env = {**layout.env, "SLURMRESTD_SECURITY": "disable_user_check"}
    plugin = RESTD_PLUGINS[layout.release]
    log_dir = layout.root / "log"
    if not restd_local_healthy(layout):
        layout.restd_socket.unlink(missing_ok=True)
        pid = procs.spawn(
            [
                "slurmrestd",
                "-f",
                str(layout.conf),
                "-s",
                plugin,
                "-a",
                "rest_auth/local",
                f"unix:{layout.restd_socket}",
            ],
            log=log_dir / "slurmrestd-local.log",
            env=base_env,
        )
        (layout.root / "run" / "slurmrestd-local.pid").write_text(str(pid))
        procs.wait_for(
            layout.restd_socket.exists,
            20,
            "slurmrestd (unix socket)",
            hint=f"see {log_dir / 'slurmrestd-local.log'}",
        )
    if not procs.port_open(layout.restd_port):
        pid = procs.spawn(
            [
                "slurmrestd",
                "-f",
                str(layout.conf),
                "-s",
                plugin,
                "-a",
                "rest_auth/jwt",
                f"127.0.0.1:{layout.restd_port}",
            ],
            log=log_dir / "slurmrestd-jwt.log",
            env={**base_env, "SLURM_JWT": "daemon"},
        )
        (layout.root / "run" / "slurmrestd-jwt.pid").write_text(str(pid))
        procs.wait_for(
            lambda: procs.port_open(layout.restd_port),
            20,
            "slurmrestd (JWT)",
            hint=f"see {log_dir / 'slurmrestd-jwt.log'}",
        )


def restd_local_healthy(layout: SlurmLayout) -> bool:
    pid = procs.read_pid(layout.root / "run" / "slurmrestd-local.pid")
    return procs.pid_alive(pid) and layout.restd_socket.exists()


def restd_jwt_healthy(layout: SlurmLayout) -> bool:
    pid = procs.read_pid(layout.root / "run" / "slurmrestd-jwt.pid")
    return procs.pid_alive(pid) and procs.port_open(layout.restd_port)


def scancel_all(layout: SlurmLayout) -> None:
    """Cancel every job of this cluster (best effort: the controller may be down)."""
    if ctld_pid(layout) is None:
        return
    env = layout.process_env
    listed = subprocess.run(
        ["squeue", "--noheader", "--format=%i"],
        env=env,
        capture_output=True,
        text=True,
        timeout=20,
        check=False,
    )
    ids = [line.strip() for line in listed.stdout.splitlines() if line.strip()]
    if ids:
        # Best effort: with ten thousand jobs scancel can outlast its timeout; the daemons are
        # stopped next anyway, and `down` must not fail half-way.
        with contextlib.suppress(subprocess.TimeoutExpired):
            subprocess.run(["scancel", *ids], env=env, capture_output=True, timeout=60, check=False)
