"""`relaunch dev status`: each part of a local stack, its address and whether it is healthy."""

from __future__ import annotations

import asyncio
import urllib.error
import urllib.request
from typing import TYPE_CHECKING

from pydantic import BaseModel

from relaunch.devstack import accounting, procs, services
from relaunch.devstack.slurm import (
    ctld_pid,
    munge_healthy,
    restd_jwt_healthy,
    restd_local_healthy,
    slurmd_pid,
)
from relaunch.models.config import ClusterConfig, listen_address
from relaunch.models.errors import RelaunchError

if TYPE_CHECKING:
    from relaunch.devstack.clusters import ClusterHome
    from relaunch.devstack.stack import Stack


# How long `relaunch dev status` waits for a process's /healthz: a stopped (SIGSTOP) or wedged
# process does not answer, and is reported down after this.
HEALTH_TIMEOUT_S = 3.0


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


def stack_status(stack: Stack) -> StackStatus:
    """Each part of ``stack``: Temporal, PostgreSQL, each cluster's Slurm, the services."""
    parts: list[Part] = []
    tpid = services.temporal_pid(stack.temporal_root)
    parts.append(
        Part(
            name="temporal",
            address=f"{stack.temporal_address} (UI {stack.temporal_ui})",
            pid=tpid,
            healthy=bool(tpid) and procs.port_open(stack.config.temporal_port),
        )
    )
    db_ok = stack.database_ok()
    parts.append(
        Part(
            name="postgres",
            address=stack.redacted_db(),
            pid=None if stack.config.database_url else services.postgres_pid(stack.postgres_root),
            healthy=db_ok,
            detail="external (RELAUNCH_DATABASE_URL)" if stack.config.database_url else "embedded",
        )
    )
    for home in stack.clusters:
        parts.extend(cluster_parts(stack, home))
    if db_ok:
        from relaunch.devstack.pause_status import pause_parts  # it imports Part from here

        parts.extend(pause_parts(stack))
    if stack.config.services:
        for name, home in stack.relaunch_services():
            parts.append(service_part(stack, name, home))
    return StackStatus(state_dir=str(stack.state_dir), parts=parts)


def service_part(stack: Stack, name: str, home: ClusterHome) -> Part:
    """A Relaunch process: running, and its /healthz answering 200 within HEALTH_TIMEOUT_S
    (a wedged or stopped process does not). The worker and the watcher are shown at their
    metrics URL; the console at its own."""
    pid = home.service_pid(name)
    log = f"log {home.log_file(name)}"
    base: str | None
    if name == "console":
        base = stack.console_url.rstrip("/")
        address = stack.console_url
    else:
        base = service_base_url(home, name)
        address = f"{base}/metrics" if base else f"cluster {home.name} (metrics off)"
    if pid is None:
        return Part(name=stack.service_label(name, home), address=address, healthy=False)
    healthy, why = (True, "") if base is None else probe_health(f"{base}/healthz")
    return Part(
        name=stack.service_label(name, home),
        address=address,
        pid=pid,
        healthy=healthy,
        detail=f"{why}; {log}" if why else log,
    )


def service_base_url(home: ClusterHome, name: str) -> str | None:
    """``http://host:port`` of the worker's or the watcher's metrics server, from the cluster's
    configuration; None when it is off (or the configuration cannot be read)."""
    try:
        metrics = ClusterConfig.model_validate_json(home.config_path.read_text()).metrics
    except (OSError, ValueError):
        return None
    address = listen_address(metrics.watch_address if name == "watch" else metrics.worker_address)
    if address is None:
        return None
    host, port = address
    host = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(host, host)
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def probe_health(url: str, timeout_s: float = HEALTH_TIMEOUT_S) -> tuple[bool, str]:
    """(healthy, why not): a GET of ``url`` answered 200 within ``timeout_s``."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:  # noqa: S310 - our own
            return resp.status == 200, ""
    except urllib.error.HTTPError as exc:
        body = exc.read(500).decode("utf-8", "replace").strip()
        text = "".join(c if c.isprintable() else " " for c in body)
        return False, f"/healthz {exc.code}: {text}"
    except (OSError, urllib.error.URLError) as exc:
        reason = getattr(exc, "reason", exc)
        return False, f"/healthz did not answer: {reason}"


def cluster_parts(stack: Stack, home: ClusterHome) -> list[Part]:
    """One cluster's Slurm daemons; named with the cluster where the stack has several."""
    slurm = home.slurm
    of = f" {home.name}" if len(stack.clusters) > 1 else ""
    parts = [
        Part(
            name=f"munged{of}",
            address=str(slurm.munge_socket),
            pid=procs.read_pid(slurm.munge_key.parent / "munged.pid"),
            healthy=munge_healthy(slurm),
        )
    ]
    cpid = ctld_pid(slurm)
    nodes_detail = ""
    nodes_by_name = {}
    if cpid:
        try:
            nodes_by_name = {
                n.name: n for n in asyncio.run(stack.scheduler(home.name).list_nodes())
            }
        except RelaunchError as exc:
            nodes_detail = str(exc)
    parts.append(
        Part(
            name=f"slurmctld{of}",
            address=f"127.0.0.1:{slurm.slurmctld_port}",
            pid=cpid,
            healthy=bool(cpid) and bool(nodes_by_name),
            detail=nodes_detail
            or f"Slurm {slurm.release} SLURM_CONF={slurm.conf} cred_expire={slurm.cred_expire}s",
        )
    )
    for node, port in zip(slurm.nodes, slurm.slurmd_ports, strict=True):
        pid = slurmd_pid(slurm, node)
        info = nodes_by_name.get(node)
        parts.append(
            Part(
                name=f"slurmd{of} {node}",
                address=f"127.0.0.1:{port}",
                pid=pid,
                healthy=bool(pid) and info is not None and info.responding,
                detail=info.display_state.lower() if info else "",
            )
        )
    parts.append(
        Part(
            name=f"slurmrestd{of} (local)",
            address=f"unix:{slurm.restd_socket}",
            pid=procs.read_pid(slurm.root / "run" / "slurmrestd-local.pid"),
            healthy=restd_local_healthy(slurm),
        )
    )
    parts.append(
        Part(
            name=f"slurmrestd{of} (jwt)",
            address=f"http://127.0.0.1:{slurm.restd_port}",
            pid=procs.read_pid(slurm.root / "run" / "slurmrestd-jwt.pid"),
            healthy=restd_jwt_healthy(slurm),
        )
    )
    if slurm.accounting:
        parts += [
            Part(
                name=f"mariadb{of} (accounting)",
                address=f"127.0.0.1:{accounting.db_port(slurm)}",
                pid=accounting.db_pid(slurm),
                healthy=accounting.db_pid(slurm) is not None,
            ),
            Part(
                name=f"slurmdbd{of}",
                address=f"127.0.0.1:{accounting.dbd_port(slurm)}",
                pid=accounting.dbd_pid(slurm),
                healthy=accounting.healthy(slurm),
            ),
        ]
    return parts
